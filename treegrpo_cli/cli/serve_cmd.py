from __future__ import annotations

from typing import Annotated

import typer

from .common import DEVICE_HELP, err, guarded


def serve_reward(
    reward: Annotated[str, typer.Option(help="Reward name(s) to serve, comma separated.")],
    reward_opt: Annotated[
        list[str] | None,
        typer.Option("--reward-opt", help="A reward option NAME.KEY=VALUE, e.g. clip.checkpoint=/w (repeatable)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind; loopback unless you mean otherwise.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one, printed).")] = 8000,
    device: Annotated[str, typer.Option(help=DEVICE_HELP + " (the reward models).")] = "auto",
    dtype: Annotated[str | None, typer.Option(help="Reward model dtype: fp32, bf16 or fp16.")] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="TREEGRPO_REWARD_TOKEN",
            help="A shared token every request must carry (clients send $TREEGRPO_REWARD_TOKEN).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve rewards over HTTP, for runs that name the server as their reward (rewards/remote.py).

    Examples:

      treegrpo serve-reward --reward shapes --port 8000

      treegrpo serve-reward --reward hps,pick --port 8000

      treegrpo train --reward http://127.0.0.1:8000   # scored by that server
    """
    from ..errors import TreegrpoError
    from ..preflight import resolve_device
    from ..rewards.base import get_reward, parse_reward_options, parse_rewards
    from ..rewards.remote import is_url, make_server

    with guarded():
        device = resolve_device(device)
        names = list(parse_rewards(reward))
        if any(is_url(n) for n in names):
            raise TreegrpoError("a server serves the tool's own rewards, not another server's URL")
        opts = parse_reward_options(reward_opt or [])
        rewards = {n: get_reward(n, device=device, dtype=dtype, **opts.get(n, {})) for n in names}
        try:
            server = make_server(rewards, host, port, log=_say, token=token or "")
        except OSError as e:
            raise TreegrpoError(f"cannot listen on {host}:{port} ({e.strerror})") from None
    bound = server.server_address[1]
    err.print(f"serving {', '.join(names)} on http://{host}:{bound} (Ctrl-C stops)", highlight=False)
    _exposure_warning(host, bound, bool(token))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _say(message: str) -> None:
    """The server's log: one line each, control characters shown."""
    from .common import one_line

    err.print(one_line(message), highlight=False)


def _exposure_warning(host: str, port: int, token: bool) -> None:
    """A warning naming the exposure when the server listens beyond this machine."""
    from ..rewards.remote import is_loopback
    from .common import one_line

    if is_loopback(host):
        return
    where = "every network interface" if host in ("", "0", "0.0.0.0", "::") else host
    guard = "requests must carry the token" if token else "no token: anyone who can reach it can use it"
    err.print(f"warning: listening on {one_line(where)} port {port}, not only this machine; {guard}", highlight=False)
