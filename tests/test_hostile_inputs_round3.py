"""Hostile inputs, round three: text files with bytes that are not UTF-8 (an image-to-video frames file, a
prompts file, a config, a prompt map), config values of a size no setting takes (echoed whole before), and idle
connections that hold every slot of the reward server. Each: one short line and a non-zero exit, or a server
that goes on serving."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from clitools import PIXEL, one_line_error, refused, run, write_pngs

BAD = b"\xff\xfe"  # never UTF-8


# --- text that is not UTF-8: one line naming the file and the line ----------------------------------------


@pytest.fixture(scope="module")
def i2v_dir(tmp_path_factory):
    from tinypipes import saved, tiny_wan_i2v

    return saved(tmp_path_factory, {"wan-i2v": tiny_wan_i2v})["wan-i2v"]


@pytest.mark.slow
def test_an_i2v_frames_file_with_bytes_that_are_not_utf8_is_one_line(i2v_dir, tmp_path):
    from PIL import Image
    from test_models_wan import TINY_CLIP_SETS

    Image.new("RGB", (40, 24), (200, 30, 30)).save(tmp_path / "first.png")
    frames = tmp_path / "f.jsonl"
    frames.write_bytes(b'{"prompt": "a red cat", "image": "first.png"}\n' + BAD + b"\n")
    (tmp_path / "p.txt").write_text("a red cat\n")
    sets = [*TINY_CLIP_SETS, f'policy.images="{frames}"']
    args = ["rollout", "--model", i2v_dir, "--prompts", tmp_path / "p.txt", "-n", 1, "--out", tmp_path / "trees"]
    refused([*args, *(x for s in sets for x in ("--set", s))], [f"{frames}:2:", "not UTF-8"], frames)


def test_a_prompts_file_with_bytes_that_are_not_utf8_names_the_line(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"a red circle\ntwo blue squares " + BAD + b"\n")
    refused(["rollout", *PIXEL, "--prompts", prompts, "-n", 1, "--out", tmp_path / "t"], [f"{prompts}:2:"], prompts)


def test_a_config_with_bytes_that_are_not_utf8_names_the_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_bytes(b"[tree]\nbranch = 2\n# caf" + b"\xe9" + b"\n")
    refused(["rollout", *PIXEL, "--config", config, "-n", 1, "--out", tmp_path / "t"], [f"{config}:3:"], config)


@pytest.mark.parametrize("name", ["prompts.json", "prompts.csv"])
def test_a_prompt_map_with_bytes_that_are_not_utf8_names_the_line(tmp_path, name):
    folder = write_pngs(tmp_path / "imgs", 2)
    (folder / "prompts.json").unlink()
    head = b"{\n" if name.endswith(".json") else b"image,prompt\n"
    (folder / name).write_bytes(head + b'"000.png": "a red ' + BAD + b'"\n')
    refused(["eval", "--images", folder, "--metric", "jpeg-compressibility"], [f"{folder / name}:2:"], folder)


# --- config values of a size no setting takes: refused in one short line ----------------------------------

HUGE = {
    "two million split steps": "[tree]\nsplit_steps = [" + ", ".join(["1"] * 2_000_000) + "]\n",
    "repeated split steps under the size cap": "[tree]\nsplit_steps = [" + ", ".join(["1"] * 900) + "]\n",
    "a long string where a word is expected": f'[train]\nloss_norm = "{"x" * 100_000}"\n',
    "a path longer than any path": f'[rollout]\nprompts = "{"p" * 20_000}"\n',
    "an integer of 5,000 digits": f"[tree]\nbranch = {'1' * 5000}\n",
}


@pytest.mark.parametrize("text", HUGE.values(), ids=HUGE.keys())
def test_a_config_value_is_never_echoed_whole(tmp_path, text):
    config = tmp_path / "c.toml"
    config.write_text(text)
    r = run("rollout", *PIXEL, "--config", config, "-n", 1, "--out", tmp_path / "t")
    one_line_error(r)
    assert "Traceback" not in r.output and "this is a bug" not in r.stderr and "system error" not in r.stderr
    assert len(r.stderr.encode()) < 1000, r.stderr[:300]


def test_a_set_value_is_never_echoed_whole(tmp_path):
    for item in ("tree.branch=" + "1" * 5000, f"rollout.prompts={'p' * 20_000}", f"model={'m' * 20_000}"):
        r = run("rollout", *PIXEL, "--set", item, "-n", 1, "--out", tmp_path / "t")
        one_line_error(r)
        assert "this is a bug" not in r.stderr and "system error" not in r.stderr, r.stderr[:300]
        assert len(r.stderr.encode()) < 1000, r.stderr[:300]


# --- the reward server: idle connections are cut for a client that sends its request --------------------


@pytest.fixture
def small_server(monkeypatch):
    """A reward server on 127.0.0.1 (shapes) with 8 slots and header and body deadlines far past the test."""
    from treegrpo_cli.rewards import remote
    from treegrpo_cli.rewards.base import get_reward

    monkeypatch.setattr(remote, "MAX_CONNECTIONS", 8)
    for name in ("HEADER_SECONDS", "BODY_SECONDS", "READ_SECONDS"):
        monkeypatch.setattr(remote, name, 60.0)
    srv = remote.make_server({"shapes": get_reward("shapes")})
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _score_body() -> bytes:
    import base64

    img = {"dtype": "uint8", "shape": [1, 3, 4, 4], "data": base64.b64encode(bytes(48)).decode()}
    return json.dumps({"version": 1, "reward": "shapes", "prompts": ["a"], "images": img}).encode()


def _settled(server, taken: int, seconds: float = 5.0) -> bool:
    """Within `seconds`, the server holds `taken` connections, all past their headers."""
    slots, end = server.slots, time.monotonic() + seconds
    while time.monotonic() < end:
        if slots.free._value == 8 - taken and not slots.waiting:  # the semaphore's count of free slots
            return True
        time.sleep(0.02)
    return False


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True


def _answer(s: socket.socket) -> bytes:
    """What the server sends until it closes (HTTP/1.0: after one answer); at most 1 MiB."""
    out = b""
    while len(out) < 1 << 20:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        out += chunk
    return out


@pytest.mark.slow
def test_idle_connections_are_cut_oldest_first_for_a_client_that_sends_its_request(small_server):
    port, body = small_server.server_address[1], _score_body()
    head = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    posting: list[socket.socket] = []
    idle: list[socket.socket] = []
    try:
        for _ in range(4):  # past their headers, sending their bodies: never cut for a newcomer
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(head + body[:10])
            posting.append(s)
        assert _settled(small_server, 4)  # the server has read their headers
        for _ in range(30):  # a trickle of idle connections, more than the slots
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            idle[-1].sendall(b"GET /info HTTP/1.1\r\n")  # and never the rest
        t0 = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=10) as r:
            assert r.status == 200 and json.loads(r.read())["rewards"] == ["shapes"]
        assert time.monotonic() - t0 < 3
        assert _closed(idle[0])  # the oldest idle one was cut
        for s in posting:  # the ones past their headers were kept: they finish and are scored
            s.sendall(body[10:])
            answer = _answer(s)
            assert answer.startswith(b"HTTP/1.0 200") and b'"scores"' in answer, answer[:200]
    finally:
        for s in posting + idle:
            s.close()


@pytest.mark.slow
def test_with_every_slot_past_its_headers_a_newcomer_still_gets_503(small_server):
    port, body = small_server.server_address[1], _score_body()
    head = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    held = []
    try:
        for _ in range(8):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            held[-1].sendall(head)
        assert _settled(small_server, 8)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=10)
        assert e.value.code == 503 and "busy" in e.value.read().decode()
    finally:
        for s in held:
            s.close()
