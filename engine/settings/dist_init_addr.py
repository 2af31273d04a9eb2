"""``dist_init_addr``, where the ranks of several machines meet (node 0's rendezvous):
read here, in the settings' layer, so that a bad address is a setting's error before
anything starts. A leaf module."""

from __future__ import annotations

from hetero_infer.engine.settings.exceptions import ConfigError

# The rendezvous port when an address names none: torchrun's and SGLang's default.
DEFAULT_PORT = 29500


def split_init_addr(text: str) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port); the port is
    DEFAULT_PORT when none is given. ConfigError naming the address otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"dist_init_addr must be HOST:PORT, got {text!r}")
    text = text.strip()
    if text.startswith("["):  # [::1]:29500: the brackets keep the address's colons apart
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":") if rest.startswith(":") else None
        if rest and port_text is None:
            raise ConfigError(f"dist_init_addr must be [HOST]:PORT, got {text!r}")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:  # no port, or a bare IPv6 address (its colons are not a port's)
        host, port_text = text, None
    if not host:
        raise ConfigError(f"dist_init_addr names no host: {text!r}")
    if port_text is None or port_text == "":
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"dist_init_addr's port must be in 1..65535, got {text!r}")
    return host, int(port_text)
