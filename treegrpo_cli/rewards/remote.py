"""A reward over HTTP: a server that scores with any of the tool's rewards, and the client reward that calls it.

Reward models often need other package versions than the training stack (Flow-GRPO's answer is a separate
reward server); `treegrpo serve-reward` runs them in their own process, or environment, or machine, and a run
names the server where it would name a reward: `--reward http://127.0.0.1:8000` (the server's one reward) or
`http://127.0.0.1:8000/clip` (one of several), with `?timeout=60&retries=3&batch=32` to tune the client.

Wire format, version 1 (JSON over HTTP/1.1; the standard library on both sides: no dependency to pin, and a
request per batch is far from needing more):

    GET  /info   -> {"version": 1, "rewards": ["shapes", ...]}
    POST /score  {"version": 1, "reward": "shapes", "prompts": [B strings], "meta": [B objects] (optional),
                  "images": {"dtype": "uint8", "shape": [B, 3, H, W], "data": base64 of the B*3*H*W bytes}}
         -> {"version": 1, "reward": "shapes", "scores": [B numbers]}   or   {"error": "..."} with status 400

Images travel as the uint8 arrays the tool stores and scores (lossless and exact: the server's reward sees the
same values an in-process one does; PNG would be smaller but costs an encode and a decode per image, and the
server is usually on the same machine). The server only parses JSON and base64 into a uint8 array of the
stated shape: it never evaluates, imports or unpickles anything it receives, caps the body and the image
sizes, and binds to loopback unless told otherwise.

Bounds (the constants below): the server cuts a request whose headers or body do not arrive in time (a trickle
too), serves MAX_CONNECTIONS at once (cutting those still sending their headers, oldest first, for new ones:
rewards/slots.py), holds at most MAX_IN_FLIGHT bytes of requests, answers every malformed one with a 4xx and
drops clients that hang up without a word; with a token (TOKEN_ENV) every request must carry it. The client gives
each try `timeout` seconds in all, reads at most MAX_ANSWER bytes, and backs off at most MAX_BACKOFF seconds
between tries.
"""

from __future__ import annotations

import base64
import hmac
import http.client
import ipaddress
import json
import math
import os
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from torch import Tensor

from ..engine.prompt import Prompt, prompt_meta
from ..errors import ConfigError, TreegrpoError
from ..store.safeio import loads_json, shown
from ..store.trees import to_uint8
from .base import score_batch
from .slots import Slots

VERSION = 1
MAX_BODY = 1 << 30  # bytes of one request
MAX_SIDE = 4096  # pixels of an image side
MAX_BATCH = 4096  # images of one request
MAX_CONNECTIONS = 64  # connections served at once; more are answered 503 and closed (rewards/slots.py)
MAX_IN_FLIGHT = 6 * MAX_BODY  # bytes that requests being read, decoded and scored may hold (6x each body)
HEADER_SECONDS = 10.0  # a request's line and headers arrive within this, all together
BODY_SECONDS = 120.0  # then its body within this
READ_SECONDS = 10.0  # and no read of them waits longer than this
BACKLOG = 256  # connections the OS queues before the server accepts them (bursts)
MAX_ANSWER = 16 << 20  # bytes of an answer the client reads
MAX_BACKOFF = 5.0  # seconds between the client's tries, at most
MAX_RETRIES = 20
MAX_TIMEOUT = 24 * 3600.0
TOKEN_ENV = "TREEGRPO_REWARD_TOKEN"  # a shared token: the server asks for it, the client sends it
CLIENT_OPTIONS = {"timeout": float, "retries": int, "batch": int}


def is_url(name: str) -> bool:
    return name.startswith(("http://", "https://"))


# --- the client -----------------------------------------------------------------------------------------


class RemoteReward:
    """A reward scored by a `treegrpo serve-reward` server (module docstring)."""

    def __init__(self, url: str):
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as e:  # 'http://[::1', 'http://host:abc'
            raise ConfigError(f"reward URL {url!r} is not http://HOST:PORT[/REWARD] ({e})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"reward URL {url!r} is not http://HOST:PORT[/REWARD]")
        self.name, self.host, self.port, self.https = url, parts.hostname, port, parts.scheme == "https"
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.timeout, self.retries, self.batch = _client_options(url, parts.query)
        self.token = os.environ.get(TOKEN_ENV, "")
        self.reward = parts.path.strip("/") or self._only_reward()

    def _only_reward(self) -> str:
        served = self._call("GET", "/info", None).get("rewards")
        if not isinstance(served, list) or not served or not all(isinstance(r, str) for r in served):
            raise TreegrpoError(f"reward server {self.base} answered /info without a list of rewards")
        if len(served) > 1:
            names = ", ".join(served)[:300]
            raise ConfigError(f"reward server {self.base} serves {names}: name one, e.g. {self.base}/{served[0]}")
        return served[0]

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        """images [B, 3, H, W] float in [0, 1] -> scores [B], a request per `batch` images."""
        u8 = to_uint8(images).contiguous()  # what reward_images hands an in-process reward, as uint8
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
        if any(prompt_meta(p) for p in prompts):  # each prompt record's metadata, for a reward that reads it
            body["meta"] = [prompt_meta(p) for p in prompts]
        answer = self._call("POST", "/score", json.dumps(body).encode())
        scores = answer.get("scores")
        if not isinstance(scores, list) or not all(_number(s) for s in scores):
            raise TreegrpoError(f"reward server {self.base} answered something that is not a list of scores")
        if len(scores) != len(prompts):
            raise TreegrpoError(f"reward server {self.base} answered {len(scores)} scores for {len(prompts)} images")
        return torch.tensor([float(s) for s in scores], dtype=torch.float32)

    def _call(self, method: str, path: str, data: bytes | None) -> dict[str, Any]:
        """One request with retries (exponential backoff from 0.5 s, at most MAX_BACKOFF) on a refused,
        dropped or timed-out connection and on a 5xx; a 4xx is the server's own one-line refusal, not
        retried. Each try has `timeout` seconds in all (connecting, sending, the whole answer)."""
        why = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(MAX_BACKOFF, 0.5 * 2 ** (attempt - 1)))
            try:
                code, raw = self._once(method, path, data)
            except TimeoutError:
                why = "timed out"
                continue
            except (OSError, http.client.HTTPException) as e:
                why = str(getattr(e, "strerror", None) or e or type(e).__name__)[:200]
                continue
            if code == 200:
                return _json_object(raw, self.base)
            if code < 500:
                raise TreegrpoError(f"reward server {self.base} refused the request: HTTP {code} {_error_text(raw)}")
            why = f"HTTP {code} {_error_text(raw)}"
        tries = self.retries + 1
        raise TreegrpoError(
            f"reward server {self.base} did not answer ({why}) after {tries} tr{'y' if tries == 1 else 'ies'}; "
            "start it with `treegrpo serve-reward --reward NAME --port PORT` or check the URL"
        )

    def _once(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        """(status, body) of one request within `timeout` seconds in all: a watchdog closes the connection at
        the deadline (a server that trickles its answer a byte at a time is cut off too)."""
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = kind(self.host, self.port, timeout=self.timeout)
        expired, held = threading.Event(), list[socket.socket]()  # held: the socket once connected (read by the answer)

        def expire() -> None:
            expired.set()
            for sock in held:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(self.timeout, expire)
        watchdog.daemon = True
        watchdog.start()
        headers = {"Content-Type": "application/json"} | (
            {"Authorization": f"Bearer {self.token}"} if self.token else {}
        )
        try:
            conn.connect()
            held.append(conn.sock)
            if expired.is_set():
                raise TimeoutError
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            n = r.getheader("Content-Length")
            if n is not None and n.isdigit() and int(n) > MAX_ANSWER:
                raise http.client.HTTPException(f"an answer of {int(n):,} bytes, more than {MAX_ANSWER:,}")
            raw = r.read(MAX_ANSWER + 1)
            if expired.is_set():
                raise TimeoutError
            if len(raw) > MAX_ANSWER:
                raise http.client.HTTPException(f"an answer of more than {MAX_ANSWER:,} bytes")
            if n is not None and n.isdigit() and len(raw) < int(n):
                raise http.client.HTTPException(f"the connection closed after {len(raw)} of {n} bytes of the answer")
            return r.status, raw
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise TimeoutError from None
            raise
        finally:
            watchdog.cancel()
            conn.close()


def _client_options(url: str, query: str) -> tuple[float, int, int]:
    """(timeout, retries, batch) from a reward URL's query; one ConfigError line for anything else."""
    opts = urllib.parse.parse_qs(query)
    bad = sorted(set(opts) - set(CLIENT_OPTIONS))
    if bad:
        raise ConfigError(f"reward URL {url!r}: unknown option {bad[0]!r} (options: {', '.join(CLIENT_OPTIONS)})")
    try:
        got = {k: CLIENT_OPTIONS[k](v[-1]) for k, v in opts.items()}
    except ValueError:
        raise ConfigError(f"reward URL {url!r}: timeout, retries and batch must be numbers") from None
    timeout, retries, batch = got.get("timeout", 60.0), got.get("retries", 3), got.get("batch", 64)
    if not (0 < timeout <= MAX_TIMEOUT and 0 <= retries <= MAX_RETRIES and 1 <= batch <= MAX_BATCH):
        raise ConfigError(
            f"reward URL {url!r}: 0 < timeout <= {MAX_TIMEOUT:g} seconds, 0 <= retries <= {MAX_RETRIES} and "
            f"1 <= batch <= {MAX_BATCH}, please"
        )
    return float(timeout), int(retries), int(batch)


def _b64(u8: Tensor) -> str:
    return base64.b64encode(u8.numpy().tobytes()).decode("ascii")


def _number(x: Any) -> bool:
    """A finite number that a float32 holds (a 400-digit integer is not one)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x)) and abs(float(x)) <= 3.4e38
    except OverflowError:
        return False


def _json_object(raw: bytes, base: str) -> dict[str, Any]:
    try:
        obj = loads_json(raw)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict):
        raise TreegrpoError(f"reward server {base} answered something that is not a JSON object")
    if obj.get("version") != VERSION:
        raise TreegrpoError(
            f"reward server {base} speaks wire version {shown(obj.get('version'), 40)}, this client {VERSION}"
        )
    return obj


def _error_text(raw: bytes) -> str:
    try:
        obj = loads_json(raw)
        text = str(obj.get("error", "")) if isinstance(obj, dict) else ""
    except (ValueError, UnicodeDecodeError):
        text = raw[:200].decode(errors="replace")
    return (text.strip().splitlines() or [""])[0][:200]


# --- the server ----------------------------------------------------------------------------------------


def decode_request(raw: bytes, served: dict[str, Any]) -> tuple[str, Tensor, list[str]]:
    """(reward name, images [B, 3, H, W] uint8, prompts) of a /score body, every field checked (the image
    bytes from the shape before any is decoded); a ValueError with the reason otherwise."""
    try:
        body = loads_json(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"the body is not JSON ({str(e)[:100]})") from None
    if not isinstance(body, dict) or body.get("version") != VERSION:
        raise ValueError(f"the body must be an object with version {VERSION}")
    name, prompts, images = body.get("reward"), body.get("prompts"), body.get("images")
    if not isinstance(name, str) or name not in served:
        raise ValueError(f"this server scores {', '.join(served)}, not {shown(name, 60)}")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list of strings")
    meta = body.get("meta", [{}] * len(prompts))
    if not isinstance(meta, list) or len(meta) != len(prompts) or not all(isinstance(m, dict) for m in meta):
        raise ValueError("meta, when given, must be a list of one object per prompt")
    prompts = [Prompt(p, m) for p, m in zip(prompts, meta, strict=True)]
    if not isinstance(images, dict) or images.get("dtype") != "uint8":
        raise ValueError('images must be {"dtype": "uint8", "shape": [B, 3, H, W], "data": base64}')
    shape = images.get("shape")
    if not (isinstance(shape, list) and len(shape) == 4 and all(type(n) is int and n > 0 for n in shape)):
        raise ValueError("images.shape must be four whole numbers [B, 3, H, W]")
    if shape[1] != 3 or shape[0] > MAX_BATCH or max(shape[2:]) > MAX_SIDE or shape[0] != len(prompts):
        raise ValueError(f"images.shape {shape}: B = len(prompts) <= {MAX_BATCH}, 3 channels, sides <= {MAX_SIDE}")
    text = images.get("data", "")
    if not isinstance(text, str) or len(text) % 4:
        raise ValueError("images.data is not base64")
    size = len(text) // 4 * 3 - (text[-2:].count("=") if text else 0)  # its bytes, before any is decoded
    if size != math.prod(shape):
        raise ValueError(f"images.data holds {size} bytes for a shape of {math.prod(shape)}")
    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise ValueError("images.data is not base64") from None
    return name, torch.frombuffer(bytearray(data), dtype=torch.uint8).view(*shape), prompts


class _Budget:
    """Bytes that requests may hold at once (their bodies and what decoding them makes)."""

    def __init__(self, total: int):
        self.total, self.used, self.lock = total, 0, threading.Lock()

    def take(self, n: int) -> bool:
        with self.lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self.lock:
            self.used -= n


_BUSY = b'{"error": "the server is busy: too many connections"}'
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
BUSY += b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)  # to a connection over MAX_CONNECTIONS


class RewardServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with bounds: at most MAX_CONNECTIONS served at once (Slots: the rest get 503), a deep
    listen backlog, and clients that hang up or time out dropped without a traceback."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(
        self, address: tuple[str, int], handler: type, log: Callable[[str], None], rewards: dict[str, Any], token: str
    ):
        self.rewards, self.token, self.scoring = rewards, token, threading.Lock()
        self.slots = Slots(MAX_CONNECTIONS)
        self.memory = _Budget(MAX_IN_FLIGHT)
        self.log = log
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.take(request):
            try:
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.give(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        e = sys.exc_info()[1]
        if isinstance(e, (ConnectionError, TimeoutError)):
            return  # a client that hung up or stalled: nothing to say
        self.log(f"error serving {client_address[0]}: {type(e).__name__}: {str(e)[:200]}")


def is_loopback(host: str) -> bool:
    """Does binding `host` listen on this machine only? ("" and "0" listen on every interface.)"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Handler(BaseHTTPRequestHandler):
    """GET /info and POST /score of a RewardServer (its rewards, scoring lock, log and token)."""

    timeout = READ_SECONDS  # each read; HEADER_SECONDS and BODY_SECONDS bound them all (_deadline)
    server: RewardServer

    def setup(self) -> None:
        super().setup()
        self._deadline(HEADER_SECONDS)

    def _deadline(self, seconds: float) -> None:
        """Cut the connection `seconds` from now unless the request is in by then (a trickle too)."""
        old = getattr(self, "watchdog", None)
        if old is not None:
            old.cancel()
        self.watchdog = threading.Timer(seconds, self._cut)
        self.watchdog.daemon = True
        self.watchdog.start()

    def _cut(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def parse_request(self) -> bool:
        ok = super().parse_request()  # reads the headers
        self.server.slots.headers_in(self.connection)
        return ok

    def finish(self) -> None:
        self.watchdog.cancel()
        try:
            super().finish()
        except OSError:
            pass

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client hung up or stalled

    def _allowed(self) -> bool:
        given = self.headers.get("Authorization", "")
        token = self.server.token
        if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            self._send(401, {"error": f"this server needs its token (the client sends ${TOKEN_ENV})"})
            return False
        return True

    def do_GET(self) -> None:
        self.watchdog.cancel()
        if not self._allowed():
            return
        if self.path != "/info":
            return self._send(404, {"error": "GET /info or POST /score"})
        self._send(200, {"version": VERSION, "rewards": sorted(self.server.rewards)})

    def do_POST(self) -> None:
        if not self._allowed():
            return
        if self.path != "/score":
            return self._send(404, {"error": "GET /info or POST /score"})
        n = self.headers.get("Content-Length", "")
        if not n.isdigit():
            return self._send(411, {"error": "a Content-Length is needed"})
        if not 0 < int(n) <= MAX_BODY:
            return self._send(413, {"error": f"a body of 1 to {MAX_BODY} bytes, please"})
        cost = 6 * int(n)  # the body, its JSON text, the decoded bytes and their floats (3x the body)
        if not self.server.memory.take(cost):
            return self._send(503, {"error": "the server is busy decoding other requests; try again"})
        self._deadline(BODY_SECONDS)
        try:
            raw = self.rfile.read(int(n))
            self.watchdog.cancel()  # the whole request is in
            if len(raw) < int(n):
                return self._send(400, {"error": f"the body ended after {len(raw)} of {n} bytes"})
            try:
                name, u8, prompts = decode_request(raw, self.server.rewards)
            except ValueError as e:
                return self._send(400, {"error": str(e)})
            del raw
            self._score(name, u8, prompts)
        finally:
            self.server.memory.give(cost)

    def _score(self, name: str, u8: Tensor, prompts: list[str]) -> None:
        t0 = time.perf_counter()
        try:
            with self.server.scoring, torch.no_grad():
                scores = score_batch(self.server.rewards[name], u8, prompts).float().cpu().tolist()
        except Exception as e:  # the reward's own failure: one line here, a 500 there
            self.server.log(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            return self._send(500, {"error": f"{name} failed: {type(e).__name__}: {str(e)[:200]}"})
        self.server.log(f"{name}: {len(prompts)} images in {time.perf_counter() - t0:.2f} s")
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


def make_server(
    rewards: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 0,
    log: Callable[[str], None] = lambda m: None,
    token: str = "",
) -> RewardServer:
    """An HTTP server scoring with `rewards` ({name: Reward}); one scoring at a time (models need not be
    thread-safe). port 0: any free port (server.server_address[1]). A token: every request must carry
    `Authorization: Bearer TOKEN`."""
    return RewardServer((host, port), _Handler, log, rewards, token)
