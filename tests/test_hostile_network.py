"""A hostile network against the reward server and its client (rewards/remote.py): connections that never
finish, bodies that explode when decoded, answers that never end or trickle, URLs and answers that are
malformed, hosts off loopback. Each case: the server goes on serving, the client ends in one line."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from clitools import one_line_error, run

from treegrpo_cli.errors import TreegrpoError
from treegrpo_cli.rewards import remote
from treegrpo_cli.rewards.base import get_reward
from treegrpo_cli.rewards.remote import RemoteReward, decode_request, is_loopback, make_server

pytestmark = pytest.mark.slow  # end-to-end: `pytest -m "not slow"` leaves this file out


@pytest.fixture
def server(monkeypatch):
    """A real reward server on 127.0.0.1 (shapes) with short deadlines; yields its port."""
    monkeypatch.setattr(remote, "HEADER_SECONDS", 1.0)
    monkeypatch.setattr(remote, "BODY_SECONDS", 1.0)
    monkeypatch.setattr(remote, "READ_SECONDS", 1.0)
    lines: list[str] = []
    srv = make_server({"shapes": get_reward("shapes")}, log=lines.append)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.lines = lines
    yield srv
    srv.shutdown()
    srv.server_close()


def _post(port: int, body: bytes, headers: dict | None = None, timeout: float = 10) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/score", data=body, method="POST")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _body(**images) -> bytes:
    u8 = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    img = {"dtype": "uint8", "shape": [1, 3, 4, 4], "data": base64.b64encode(u8.numpy().tobytes()).decode()}
    return json.dumps({"version": 1, "reward": "shapes", "prompts": ["a"], "images": img | images}).encode()


def _info(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=10) as r:
        return r.status


# --- the server -------------------------------------------------------------------------------------------


def test_connections_that_never_finish_their_headers_are_cut_and_others_are_served(server):
    port = server.server_address[1]
    stalled = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        stalled.append(s)
    assert _info(port) == 200  # served while they stall
    time.sleep(1.5)
    for s in stalled:  # cut at the request deadline: the server closed them
        s.settimeout(2)
        assert s.recv(100) == b""
        s.close()
    assert not [ln for ln in server.lines if "Traceback" in ln or "Broken" in ln]


def test_a_header_trickle_is_cut_at_the_request_deadline_not_per_read(server):
    port = server.server_address[1]
    s = socket.create_connection(("127.0.0.1", port))
    t0, closed = time.monotonic(), False
    try:
        for c in b"GET /info HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            s.sendall(bytes([c]))
            time.sleep(0.1)  # each read within READ_SECONDS, the whole past HEADER_SECONDS
            if time.monotonic() - t0 > 3:
                break
    except OSError:
        closed = True
    s.settimeout(2)
    try:
        closed = closed or s.recv(100) == b""
    except OSError:
        closed = True
    s.close()
    assert closed and time.monotonic() - t0 < 4


def test_more_connections_than_the_cap_get_503_not_a_hang(server, monkeypatch):
    port = server.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(remote.MAX_CONNECTIONS)]
    for s in held:  # past their headers (idle ones would be cut for the newcomer: test_hostile_inputs_round3.py)
        s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    time.sleep(0.2)
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=5)
        assert e.value.code == 503 and "busy" in e.value.read().decode()
    finally:
        for s in held:
            s.close()
    time.sleep(1.5)  # the held ones are cut; the server is back
    assert _info(port) == 200


def test_a_body_beyond_the_in_flight_budget_is_503_before_it_is_read(server, monkeypatch):
    monkeypatch.setattr(server.memory, "total", 100)
    code, answer = _post(server.server_address[1], _body())
    assert code == 503 and "busy" in answer["error"]


@pytest.mark.parametrize(
    "raw, needle",
    [
        (b"[" * 100_000, "nested deeper"),
        (b'{"version": 1, "reward": ["shapes"]}', "not ['shapes']"),
        (b'{"version": 1, "reward": {"a": 1}}', "scores shapes"),
        (_body(shape={"b": 1}), "four whole numbers"),
        (_body(shape=[1, 3, "4", 4]), "four whole numbers"),
        (_body(shape=[True, 3, 4, 4]), "four whole numbers"),
        (_body(shape=[1, 3, 4.0, 4]), "four whole numbers"),
        (_body(data=12), "not base64"),
        (_body(data="A" * 5), "not base64"),
        (_body(shape=[1, 3, 4096, 4096], data="AAAA"), "holds 3 bytes"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_malformed_bodies_are_400_with_the_reason_and_no_traceback(server, raw, needle):
    code, answer = _post(server.server_address[1], raw)
    assert code == 400 and needle in answer["error"], answer
    assert _info(server.server_address[1]) == 200


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"reward": ["x"], "version": 1}'])
def test_decode_request_raises_valueerror_only(raw):
    with pytest.raises(ValueError):
        decode_request(raw, {"shapes": None})


def test_a_body_that_stalls_is_cut_at_the_body_deadline(server):
    s = socket.create_connection(("127.0.0.1", server.server_address[1]))
    s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    s.settimeout(5)
    t0 = time.monotonic()
    answer = s.recv(1000)  # a 400 for the short body, or the connection closed
    s.close()
    assert time.monotonic() - t0 < 3 and (answer == b"" or b" 400 " in answer)


def test_a_client_that_hangs_up_mid_body_is_dropped_quietly(server):
    port = server.server_address[1]
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
        s.close()
    time.sleep(0.3)
    assert _info(port) == 200 and not server.lines


def test_a_reward_that_fails_is_a_500_and_one_log_line():
    def broken(images, prompts):
        raise RuntimeError("weights on fire\nsecond line")

    lines: list[str] = []
    srv = make_server({"shapes": broken}, log=lines.append)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        code, answer = _post(srv.server_address[1], _body())
        assert code == 500 and "weights on fire" in answer["error"] and len(lines) == 1
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_token_is_asked_for_and_sent_by_the_client(monkeypatch):
    srv = make_server({"shapes": get_reward("shapes")}, token="s3cret")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    try:
        code, answer = _post(port, _body())
        assert code == 401 and "TREEGRPO_REWARD_TOKEN" in answer["error"]
        assert _post(port, _body(), {"Authorization": "Bearer wrong"})[0] == 401
        monkeypatch.delenv("TREEGRPO_REWARD_TOKEN", raising=False)
        with pytest.raises(TreegrpoError, match="HTTP 401"):
            RemoteReward(f"http://127.0.0.1:{port}/shapes?retries=0")(torch.zeros(1, 3, 4, 4), ["a"])
        monkeypatch.setenv("TREEGRPO_REWARD_TOKEN", "s3cret")
        assert RemoteReward(f"http://127.0.0.1:{port}/shapes")(torch.zeros(1, 3, 4, 4), ["a"]).shape == (1,)
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(
    "host, loop",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("", False),
        ("0", False),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
    ],
)
def test_which_hosts_are_loopback(host, loop):
    assert is_loopback(host) is loop


def test_serving_off_loopback_warns_naming_the_exposure(monkeypatch):
    from treegrpo_cli.rewards import remote as mod

    class Stop(ThreadingHTTPServer):
        def serve_forever(self, *a):
            raise KeyboardInterrupt

    def fake(rewards, host, port, log, token=""):
        return Stop(("127.0.0.1", 0), BaseHTTPRequestHandler)

    monkeypatch.setattr(mod, "make_server", fake)
    r = run("serve-reward", "--reward", "shapes", "--host", "", "--port", 0)
    assert r.exit_code == 0 and "warning: listening on every network interface" in r.stderr
    assert "no token" in r.stderr
    r = run("serve-reward", "--reward", "shapes", "--host", "0", "--port", 0, "--token", "t")
    assert "every network interface" in r.stderr and "must carry the token" in r.stderr
    r = run("serve-reward", "--reward", "shapes", "--port", 0)
    assert "warning" not in r.stderr


# --- the client -------------------------------------------------------------------------------------------


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """Silent: the client cut the connection, as the test means it to."""


def _fake(handler) -> ThreadingHTTPServer:
    srv = _Quiet(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


class _Trickle(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(1000):
            self.wfile.write(b" ")
            self.wfile.flush()
            time.sleep(0.2)  # each read well within the timeout

    def log_message(self, *a):
        """Quiet."""


class _Endless(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()
        chunk = b"[" + b"1," * 50_000
        for _ in range(10_000):  # about 1 GB unless cut
            self.wfile.write(chunk)

    def log_message(self, *a):
        """Quiet."""


class _Answer(BaseHTTPRequestHandler):
    answer = b""
    length: int | None = None

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._reply()

    def do_GET(self):
        self._reply()

    def _reply(self):
        self.send_response(200)
        self.send_header("Content-Length", str(self.length or len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *a):
        """Quiet."""


def test_a_trickling_server_is_cut_off_at_the_request_deadline():
    srv = _fake(_Trickle)
    t0 = time.monotonic()
    try:
        with pytest.raises(TreegrpoError, match=r"did not answer \(timed out\) after 1 try"):
            RemoteReward(f"http://127.0.0.1:{srv.server_address[1]}/shapes?timeout=1&retries=0")(
                torch.zeros(1, 3, 4, 4), ["a"]
            )
    finally:
        srv.shutdown()
    assert time.monotonic() - t0 < 3


def test_an_endless_answer_is_cut_at_the_size_cap(monkeypatch):
    monkeypatch.setattr(remote, "MAX_ANSWER", 1 << 20)
    srv = _fake(_Endless)
    try:
        with pytest.raises(TreegrpoError, match="more than 1,048,576 bytes"):
            RemoteReward(f"http://127.0.0.1:{srv.server_address[1]}/shapes?retries=0")(torch.zeros(1, 3, 4, 4), ["a"])
    finally:
        srv.shutdown()


@pytest.mark.parametrize(
    "answer, length, needle",
    [
        (b'{"version": 1, "scores": [1' + b"0" * 400 + b"]}", None, "not a list of scores"),
        (b'{"version": 1, "scores": [1e39]}', None, "not a list of scores"),
        (b'{"version": 1, "scores": [0.5]}', 100, "did not answer"),  # closed mid-body
        (b'{"version": 1, "scores": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, "not a JSON object"),
        (b'{"version": [[[1]]], "scores": [1]}', None, "wire version [[[1]]]"),
    ],
)
def test_malformed_answers_are_one_line(answer, length, needle):
    _Answer.answer, _Answer.length = answer, length
    srv = _fake(_Answer)
    try:
        with pytest.raises(TreegrpoError, match=needle.replace("[", r"\[")):
            RemoteReward(f"http://127.0.0.1:{srv.server_address[1]}/shapes?retries=0")(torch.zeros(1, 3, 4, 4), ["a"])
    finally:
        srv.shutdown()


def test_nested_info_answers_are_one_line():
    _Answer.answer, _Answer.length = b'{"version": 1, "rewards": ' + b"[" * 5000 + b"]" * 5000 + b"}", None
    srv = _fake(_Answer)
    try:
        with pytest.raises(TreegrpoError, match="not a JSON object"):
            RemoteReward(f"http://127.0.0.1:{srv.server_address[1]}?retries=0")
    finally:
        srv.shutdown()


@pytest.mark.parametrize(
    "url, needle",
    [
        ("http://127.0.0.1:abc/shapes", "is not http://HOST:PORT"),
        ("http://[::1/shapes", "is not http://HOST:PORT"),
        ("http://127.0.0.1:1/shapes?timeout=inf", "0 < timeout"),
        ("http://127.0.0.1:1/shapes?timeout=nan", "0 < timeout"),
        ("http://127.0.0.1:1/shapes?retries=1000", "retries <= 20"),
        ("http://127.0.0.1:1/shapes?batch=100000", "batch <= 4096"),
    ],
)
def test_malformed_urls_are_one_config_line(tmp_path, url, needle):
    r = run("train", "--reward", url, "--run-dir", tmp_path / "r", "--iterations", 1)
    one_line_error(r, needle)
    assert r.exit_code == 2


def test_the_backoff_between_tries_is_capped(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(remote.time, "sleep", slept.append)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TreegrpoError, match="after 11 tries"):
        RemoteReward(f"http://127.0.0.1:{port}/shapes?retries=10")(torch.zeros(1, 3, 4, 4), ["a"])
    assert len(slept) == 10 and max(slept) == remote.MAX_BACKOFF and sum(slept) < 60
