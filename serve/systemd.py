"""systemd units for a site (`verdict serve systemd`): vLLM and the matching API as two services that
start on boot, for the site's own install prefix, state folder and config folder. Every path in a
unit comes from the command's options; nothing of this repository is written into them.

    verdict-vllm.service  `verdict serve vllm --config NAME` (ready when /v1/models lists the adapters);
                          with a hash list, `sha256sum --check` of the weights and adapters first
    verdict-api.service   `verdict serve api --config NAME`, after vLLM (it answers 503 until vLLM is up)

Both run as an unprivileged user with a private /tmp, a read-only system except the state folder,
umask 0077 (the audit store, keys and logs are the owner's only), and restart on failure.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import BaseModel, Field, field_validator


class UnitSettings(BaseModel):
    """Where a site installed things. Absolute paths only: a unit runs from `/`."""

    config: str = Field(description="serve config name (in config_dir) or absolute file path")
    prefix: str = Field(description="the install prefix: a virtual environment with bin/verdict")
    state_dir: str = Field(description="audit store, keys, logs, caches (the serve config's root)")
    config_dir: str | None = Field(None, description="the site's config folder (verdict --config-dir)")
    vllm_python: str | None = Field(None, description="interpreter of the vLLM environment")
    hashes: str | None = Field(
        None, description="a sha256sum list of the weights and adapters, checked before vLLM starts"
    )
    user: str = "verdict"
    group: str = "verdict"
    vllm_start_timeout_s: int = Field(1800, ge=60, description="a 7B takes up to 15 minutes to load")

    @field_validator("prefix", "state_dir", "config_dir", "vllm_python", "hashes")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_absolute():
            raise ValueError(f"'{v}' must be an absolute path (a unit runs from /)")
        return v


def _exec(s: UnitSettings, *args: str) -> str:
    parts = [str(Path(s.prefix) / "bin" / "verdict")]
    if s.config_dir:
        parts += ["--config-dir", s.config_dir]
    return shlex.join([*parts, *args, "--config", s.config])


def _service(s: UnitSettings, description: str, exec_start: str, unit: list[str], extra: list[str]) -> str:
    env = [f"Environment=HOME={s.state_dir}"]  # caches (vLLM, Hugging Face) in the state folder
    if s.vllm_python:
        env.append(f"Environment=VERDICT_VLLM_PYTHON={s.vllm_python}")
    lines = [
        "[Unit]",
        f"Description={description}",
        "After=network-online.target",
        "Wants=network-online.target",
        *unit,
        "",
        "[Service]",
        "Type=simple",
        f"User={s.user}",
        f"Group={s.group}",
        f"WorkingDirectory={s.state_dir}",
        *env,
        f"ExecStart={exec_start}",
        "Restart=on-failure",
        "RestartSec=10",
        "UMask=0077",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        f"ReadWritePaths={s.state_dir}",
        *extra,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def render_units(s: UnitSettings) -> dict[str, str]:
    """File name -> text of the two units."""
    return {
        "verdict-vllm.service": _service(
            s,
            f"Verdict students (vLLM) of serve config {s.config}",
            _exec(s, "serve", "vllm"),
            [],
            [
                # weights or adapters changed since they were recorded: refuse to start (docs/deploy.md)
                *(
                    [f"ExecStartPre=/usr/bin/sha256sum --check --quiet --strict {s.hashes}"]
                    if s.hashes
                    else []
                ),
                f"TimeoutStartSec={s.vllm_start_timeout_s}",
                "TimeoutStopSec=60",
                "KillMode=control-group",  # the engine processes go with it
            ],
        ),
        "verdict-api.service": _service(
            s,
            f"Verdict matching API of serve config {s.config}",
            _exec(s, "serve", "api"),
            ["After=verdict-vllm.service", "Wants=verdict-vllm.service"],
            ["TimeoutStopSec=30"],
        ),
    }


def write_units(s: UnitSettings, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render_units(s).items():
        (out_dir / name).write_text(text)
        paths.append(out_dir / name)
    return paths
