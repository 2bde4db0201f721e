"""A reward over HTTP: a server that scores with any of the tool's rewards, and the client reward that calls it.

Reward models often need other package versions than the training stack (Flow-GRPO's answer is a separate
reward server); `treegrpo serve-reward` runs them in their own process, or environment, or machine, and a run
names the server where it would name a reward: `--reward http://127.0.0.1:8000` (the server's one reward) or
`http://127.0.0.1:8000/clip` (one of several), with `?timeout=60&retries=3&batch=32` to tune the client.

Wire format, version 1 (JSON over HTTP/1.1; the standard library on both sides: no dependency to pin, and a
request per batch is far from needing more):

    GET  /info   -> {"version": 1, "rewards": ["shapes", ...]}
    POST /score  {"version": 1, "reward": "shapes", "prompts": [B strings],
                  "images": {"dtype": "uint8", "shape": [B, 3, H, W], "data": base64 of the B*3*H*W bytes}}
         -> {"version": 1, "reward": "shapes", "scores": [B numbers]}   or   {"error": "..."} with status 400

Images travel as the uint8 arrays the tool stores and scores (lossless and exact: the server's reward sees the
same values an in-process one does; PNG would be smaller but costs an encode and a decode per image, and the
server is usually on the same machine). The server only parses JSON and base64 into a uint8 array of the
stated shape: it never evaluates, imports or unpickles anything it receives, caps the body and the image
sizes, and binds to loopback unless told otherwise.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, TreegrpoError
from ..safeio import loads_json

VERSION = 1
MAX_BODY = 1 << 30  # bytes of one request
MAX_SIDE = 4096  # pixels of an image side
MAX_BATCH = 4096  # images of one request
CLIENT_OPTIONS = {"timeout": float, "retries": int, "batch": int}


def is_url(name: str) -> bool:
    return name.startswith(("http://", "https://"))


# --- the client -----------------------------------------------------------------------------------------


class RemoteReward:
    """A reward scored by a `treegrpo serve-reward` server (module docstring)."""

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"reward URL {url!r} is not http://HOST:PORT[/REWARD]")
        opts = urllib.parse.parse_qs(parts.query)
        bad = sorted(set(opts) - set(CLIENT_OPTIONS))
        if bad:
            raise ConfigError(f"reward URL {url!r}: unknown option {bad[0]!r} (options: {', '.join(CLIENT_OPTIONS)})")
        try:
            got = {k: CLIENT_OPTIONS[k](v[-1]) for k, v in opts.items()}
        except ValueError:
            raise ConfigError(f"reward URL {url!r}: timeout, retries and batch must be numbers") from None
        self.name = url
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.timeout, self.retries, self.batch = got.get("timeout", 60.0), got.get("retries", 3), got.get("batch", 64)
        if not (self.timeout > 0 and self.retries >= 0 and self.batch >= 1):
            raise ConfigError(f"reward URL {url!r}: timeout > 0, retries >= 0 and batch >= 1, please")
        self.reward = parts.path.strip("/") or self._only_reward()

    def _only_reward(self) -> str:
        served = self._call("GET", "/info", None).get("rewards")
        if not isinstance(served, list) or not served or not all(isinstance(r, str) for r in served):
            raise TreegrpoError(f"reward server {self.base} answered /info without a list of rewards")
        if len(served) > 1:
            raise ConfigError(
                f"reward server {self.base} serves {', '.join(served)}: name one, e.g. {self.base}/{served[0]}"
            )
        return served[0]

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        """images [B, 3, H, W] float in [0, 1] -> scores [B], a request per `batch` images."""
        u8 = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().contiguous()
        out = []
        for a in range(0, len(prompts), self.batch):
            out.append(self._score(u8[a : a + self.batch], prompts[a : a + self.batch]))
        return torch.cat(out) if out else torch.zeros(0)

    def _score(self, u8: Tensor, prompts: list[str]) -> Tensor:
        body = {
            "version": VERSION,
            "reward": self.reward,
            "prompts": prompts,
            "images": {"dtype": "uint8", "shape": list(u8.shape), "data": _b64(u8)},
        }
        answer = self._call("POST", "/score", json.dumps(body).encode())
        scores = answer.get("scores")
        if not isinstance(scores, list) or not all(_number(s) for s in scores):
            raise TreegrpoError(f"reward server {self.base} answered something that is not a list of scores")
        if len(scores) != len(prompts):
            raise TreegrpoError(f"reward server {self.base} answered {len(scores)} scores for {len(prompts)} images")
        return torch.tensor(scores, dtype=torch.float32)

    def _call(self, method: str, path: str, data: bytes | None) -> dict[str, Any]:
        """One request with retries (exponential backoff from 0.5 s) on a refused, dropped or timed-out
        connection and on a 5xx; a 4xx is the server's own one-line refusal, not retried."""
        why = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(0.5 * 2 ** (attempt - 1))
            req = urllib.request.Request(self.base + path, data=data, method=method)
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return _json_object(r.read(), self.base)
            except urllib.error.HTTPError as e:
                detail = _error_text(e.read())
                if e.code < 500:
                    raise TreegrpoError(f"reward server {self.base} refused the request: {detail}") from None
                why = f"HTTP {e.code} {detail}"
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", e)
                why = "timed out" if isinstance(reason, TimeoutError) else str(getattr(reason, "strerror", reason))
        tries = self.retries + 1
        raise TreegrpoError(
            f"reward server {self.base} did not answer ({why}) after {tries} tr{'y' if tries == 1 else 'ies'}; "
            "start it with `treegrpo serve-reward --reward NAME --port PORT` or check the URL"
        )


def _b64(u8: Tensor) -> str:
    return base64.b64encode(u8.numpy().tobytes()).decode("ascii")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _json_object(raw: bytes, base: str) -> dict[str, Any]:
    try:
        obj = loads_json(raw)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise TreegrpoError(f"reward server {base} answered something that is not a JSON object")
    if obj.get("version") != VERSION:
        raise TreegrpoError(f"reward server {base} speaks wire version {obj.get('version')!r}, this client {VERSION}")
    return obj


def _error_text(raw: bytes) -> str:
    try:
        return str(loads_json(raw).get("error", "")).splitlines()[0][:200]
    except (ValueError, AttributeError, IndexError):
        return raw[:200].decode(errors="replace").strip()


# --- the server ----------------------------------------------------------------------------------------


def decode_request(raw: bytes, served: dict[str, Any]) -> tuple[str, Tensor, list[str]]:
    """(reward name, images [B, 3, H, W] uint8, prompts) of a /score body, every field checked; a ValueError
    with the reason otherwise."""
    try:
        body = loads_json(raw)
    except ValueError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(body, dict) or body.get("version") != VERSION:
        raise ValueError(f"the body must be an object with version {VERSION}")
    name, prompts, images = body.get("reward"), body.get("prompts"), body.get("images")
    if name not in served:
        raise ValueError(f"this server scores {', '.join(served)}, not {name!r}")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list of strings")
    if not isinstance(images, dict) or images.get("dtype") != "uint8":
        raise ValueError('images must be {"dtype": "uint8", "shape": [B, 3, H, W], "data": base64}')
    shape = images.get("shape")
    if not (isinstance(shape, list) and len(shape) == 4 and all(isinstance(n, int) and n > 0 for n in shape)):
        raise ValueError("images.shape must be four whole numbers [B, 3, H, W]")
    if shape[1] != 3 or shape[0] > MAX_BATCH or max(shape[2:]) > MAX_SIDE or shape[0] != len(prompts):
        raise ValueError(f"images.shape {shape}: B = len(prompts) <= {MAX_BATCH}, 3 channels, sides <= {MAX_SIDE}")
    try:
        data = base64.b64decode(images.get("data", ""), validate=True)
    except (ValueError, TypeError):
        raise ValueError("images.data is not base64") from None
    if len(data) != math.prod(shape):
        raise ValueError(f"images.data holds {len(data)} bytes for a shape of {math.prod(shape)}")
    return name, torch.frombuffer(bytearray(data), dtype=torch.uint8).view(*shape), prompts


def make_server(
    rewards: dict[str, Any], host: str = "127.0.0.1", port: int = 0, log: Callable[[str], None] = lambda m: None
) -> ThreadingHTTPServer:
    """An HTTP server scoring with `rewards` ({name: Reward}); one scoring at a time (models need not be
    thread-safe). port 0: any free port (server.server_address[1])."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/info":
                return self._send(404, {"error": "GET /info or POST /score"})
            self._send(200, {"version": VERSION, "rewards": sorted(rewards)})

        def do_POST(self) -> None:
            if self.path != "/score":
                return self._send(404, {"error": "GET /info or POST /score"})
            try:
                n = int(self.headers.get("Content-Length", ""))
            except ValueError:
                return self._send(411, {"error": "a Content-Length is needed"})
            if not 0 < n <= MAX_BODY:
                return self._send(413, {"error": f"a body of 1 to {MAX_BODY} bytes, please"})
            try:
                name, u8, prompts = decode_request(self.rfile.read(n), rewards)
            except ValueError as e:
                return self._send(400, {"error": str(e)})
            t0 = time.perf_counter()
            with lock, torch.no_grad():
                scores = rewards[name](u8.float() / 255.0, prompts).float().cpu().tolist()
            log(f"{name}: {len(prompts)} images in {time.perf_counter() - t0:.2f} s")
            self._send(200, {"version": VERSION, "reward": name, "scores": scores})

        def _send(self, code: int, obj: dict[str, Any]) -> None:
            raw = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass  # one line per scored batch above; none per request

    return ThreadingHTTPServer((host, port), Handler)
