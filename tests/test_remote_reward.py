"""A reward over HTTP (rewards/remote.py): a real `treegrpo serve-reward` process on 127.0.0.1 scores as the
in-process reward does; `train --reward http://...` runs the world; a server that is down, killed mid-run,
slow, or answers garbage or the wrong number of scores gives one line; the server refuses malformed bodies."""

import base64
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from clitools import one_line_error, run

from treegrpo_cli.rewards.base import get_reward
from treegrpo_cli.rewards.remote import RemoteReward, decode_request, make_server
from treegrpo_cli.training.runlog import read_metrics

FAST = ["--set", "rollout.num_prompts=2", "--set", "train.eval_samples=0", "--set", "train.sample_every=0"]


def _serve(*rewards: str, port: int = 0, opts: tuple[str, ...] = (), prelude: str = "") -> tuple[subprocess.Popen, int]:
    """A real server process (`treegrpo serve-reward`, after `prelude`); its port from its first line."""
    argv = ["serve-reward", "--reward", ",".join(rewards), "--port", str(port)]
    argv += [a for o in opts for a in ("--reward-opt", o)]
    code = f"{prelude}\nimport sys\nfrom treegrpo_cli.cli.app import main\nsys.argv = ['treegrpo', *{argv!r}]\nmain()"
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    line = p.stderr.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    assert m, line
    return p, int(m.group(1))


@pytest.fixture(scope="module")
def shapes_server():
    p, port = _serve("shapes", "jpeg-compressibility")
    yield port
    p.terminate()
    p.wait(timeout=30)


def _images(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8).float() / 255.0


@pytest.mark.slow
def test_scores_over_http_equal_the_in_process_reward(shapes_server):
    images, prompts = _images(), ["a red circle", "two blue squares", "a green triangle"] * 2
    for name in ("shapes", "jpeg-compressibility"):
        remote = get_reward(f"http://127.0.0.1:{shapes_server}/{name}?batch=4")  # two requests
        torch.testing.assert_close(remote(images, prompts), get_reward(name)(images, prompts), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_clip_on_a_tiny_config_scores_over_http_as_in_process(tmp_path):
    """The open_clip path through a server process: a registered tiny architecture and random weights."""
    open_clip = pytest.importorskip("open_clip")
    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (tmp_path / "tiny-remote.json").write_text(json.dumps(cfg))
    register = "from treegrpo_cli.compat import ensure_torchvision\nensure_torchvision()\nimport open_clip\n"
    register += f"open_clip.add_model_config({str(tmp_path / 'tiny-remote.json')!r})"
    exec(register)
    torch.manual_seed(0)
    torch.save(open_clip.create_model("tiny-remote", pretrained=None).state_dict(), tmp_path / "w.bin")
    opts = (f"clip.checkpoint={tmp_path / 'w.bin'}", "clip.arch=tiny-remote")
    p, port = _serve("clip", opts=opts, prelude=register)
    try:
        images, prompts = _images(5, seed=3), ["a red circle", "a photo of a cat", "two squares", "x", "y"]
        local = get_reward("clip", checkpoint=str(tmp_path / "w.bin"), arch="tiny-remote")(images, prompts)
        remote = get_reward(f"http://127.0.0.1:{port}?batch=2")(images, prompts)  # three requests
        assert local.std() > 0
        torch.testing.assert_close(remote, local, rtol=0, atol=1e-6)
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.slow
def test_a_url_without_a_reward_needs_a_server_of_one(shapes_server):
    with pytest.raises(Exception, match="serves jpeg-compressibility, shapes: name one"):
        RemoteReward(f"http://127.0.0.1:{shapes_server}")


@pytest.mark.slow
def test_train_runs_the_world_with_a_remote_reward(tmp_path):
    p, port = _serve("shapes")
    try:
        url = f"http://127.0.0.1:{port}"
        r = run("train", "--reward", url, *FAST, "--iterations", 2, "--run-dir", tmp_path / "r")
        assert r.exit_code == 0, r.output
        rows = read_metrics(tmp_path / "r")
        assert len(rows) == 2 and f"rewards/{url}/mean" in rows[0] and rows[0]["reward_std"] > 0
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.slow
def test_a_server_killed_mid_run_is_one_line_and_the_run_resumes_when_it_is_back(tmp_path):
    p, port = _serve("shapes")
    url = f"http://127.0.0.1:{port}?retries=1"
    args = ["--reward", url, *FAST, "--set", "train.save_every=1", "--run-dir", str(tmp_path / "r")]
    train = subprocess.Popen(
        [sys.executable, "-m", "treegrpo_cli", "train", *args, "--iterations", "200"],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        t0 = time.time()
        while not (tmp_path / "r" / "metrics.jsonl").exists() or not read_metrics(tmp_path / "r"):
            assert train.poll() is None and time.time() - t0 < 300, "the run did not get going"
            time.sleep(0.2)
        p.kill()  # while the run goes on
        p.wait(timeout=30)
        code, stderr = train.wait(timeout=300), train.stderr.read()
    finally:
        if train.poll() is None:
            train.kill()
    errors = [ln for ln in stderr.splitlines() if ln.startswith("Error")]  # after the progress lines
    assert code != 0 and len(errors) == 1 and stderr.strip().endswith(errors[0]) and "Traceback" not in stderr, stderr
    assert f"reward server http://127.0.0.1:{port} did not answer" in errors[0] and "serve-reward" in errors[0]
    done = len(read_metrics(tmp_path / "r"))  # nothing recorded past the last checkpoint
    assert 1 <= done < 200 and (tmp_path / "r" / "checkpoints" / f"step-{done}").is_dir()
    p2, _ = _serve("shapes", port=port)
    try:
        r = run("train", "--resume", tmp_path / "r", "--iterations", done + 1)
        assert r.exit_code == 0, r.output
        assert [row["iteration"] for row in read_metrics(tmp_path / "r")] == list(range(done + 1))
    finally:
        p2.terminate()
        p2.wait(timeout=30)


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """Silent: the client hung up on a slow answer, as the timeout test means it to."""


class _Fake(BaseHTTPRequestHandler):
    """A server that answers /score with whatever the test put in `answer` (after `delay` seconds)."""

    answer: bytes = b""
    delay: float = 0.0

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.delay)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *a):
        """No request log on stderr."""


@pytest.mark.parametrize(
    "answer, needle",
    [
        (b"<html>nope</html>", "not a JSON object"),
        (b'{"version": 1, "scores": "high"}', "not a list of scores"),
        (b'{"version": 1, "scores": [1, "x"]}', "not a list of scores"),
        (b'{"version": 1, "scores": [1, NaN]}', "not a list of scores"),
        (b'{"version": 1, "scores": [0.5, 0.5]}', "answered 2 scores for 3 images"),
        (b'{"version": 9, "scores": [1, 1, 1]}', "wire version 9"),
    ],
)
def test_garbage_and_wrong_length_answers_are_one_line(answer, needle):
    _Fake.answer, _Fake.delay = answer, 0.0
    server = _Quiet(("127.0.0.1", 0), _Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(Exception, match=needle):
            RemoteReward(f"http://127.0.0.1:{server.server_address[1]}/shapes")(_images(3), ["a"] * 3)
    finally:
        server.shutdown()


@pytest.mark.slow
def test_a_slow_server_times_out_with_one_line():
    _Fake.answer, _Fake.delay = b'{"version": 1, "scores": [1]}', 2.0
    server = _Quiet(("127.0.0.1", 0), _Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/shapes?timeout=0.3&retries=1"
        with pytest.raises(Exception, match=r"did not answer \(timed out\) after 2 tries"):
            RemoteReward(url)(_images(1), ["a"])
    finally:
        server.shutdown()


@pytest.mark.slow
def test_a_server_that_is_down_is_one_line(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run("train", "--reward", f"http://127.0.0.1:{port}/shapes?retries=0", *FAST, "--run-dir", tmp_path / "r")
    one_line_error(r, "did not answer", "after 1 try")


def _body(**over):
    u8 = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    body = {
        "version": 1,
        "reward": "shapes",
        "prompts": ["a", "b"],
        "images": {"dtype": "uint8", "shape": [2, 3, 4, 4], "data": base64.b64encode(u8.numpy().tobytes()).decode()},
    }
    body.update(over)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "raw, needle",
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "version 1"),
        (_body(version=2), "version 1"),
        (_body(reward="os.system"), "not 'os.system'"),
        (_body(prompts="ab"), "list of strings"),
        (_body(images={"dtype": "float64", "shape": [2, 3, 4, 4], "data": ""}), "uint8"),
        (_body(images={"dtype": "uint8", "shape": [2, 3, 4], "data": ""}), "four whole numbers"),
        (_body(images={"dtype": "uint8", "shape": [2, 3, 99999, 4], "data": ""}), "sides <= 4096"),
        (_body(images={"dtype": "uint8", "shape": [2, 3, 4, 4], "data": "!!"}), "not base64"),
        (_body(images={"dtype": "uint8", "shape": [2, 3, 4, 4], "data": "AAAA"}), "holds 3 bytes for a shape of 96"),
    ],
)
def test_the_server_refuses_malformed_bodies(raw, needle):
    with pytest.raises(ValueError, match=needle):
        decode_request(raw, {"shapes": None})


def test_the_server_answers_a_bad_request_with_400_and_binds_loopback():
    server = make_server({"shapes": get_reward("shapes")})
    assert server.server_address[0] == "127.0.0.1"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{server.server_address[1]}/score", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and "version 1" in json.loads(e.value.read())["error"]
    finally:
        server.shutdown()
