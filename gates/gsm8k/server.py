"""The two servers of a gate: one the gate starts from a ``command`` (stopped with its whole process group), or
one already running at a ``url``. Either way the gate waits until its health path answers 200, and says so."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PROGRESS_EVERY_S = 30.0  # how often a wait for a server the gate started says it is still waiting


class ServerError(RuntimeError):
    """A server did not start, could not be reached, or refused: the gate cannot reach a verdict (one line)."""


@dataclass
class ServerSpec:
    name: str
    command: str | None = None
    url: str | None = None
    env: dict = field(default_factory=dict)
    port: int | None = None
    health_path: str = "/v1/models"
    startup_timeout_s: float = 1800.0  # a server the gate starts: a large model loads for many minutes
    health_timeout_s: float = 10.0  # a server at a url: it is up already, or it is not there


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _say(line: str) -> None:
    print(f"gsm8k: {line}", file=sys.stderr, flush=True)


class Server:
    """A server process started from a command, stopped (its whole process group) on exit; or a running one."""

    def __init__(self, spec: ServerSpec, model: str, log_dir: Path):
        self.spec, self.proc, self.log = spec, None, None
        if spec.url:
            self.url = spec.url.rstrip("/")
            return
        port = spec.port or free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = spec.command.format(port=port, model=model)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{spec.name}.log"
        self.log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(
                shlex.split(cmd),
                stdout=self.log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **{k: str(v) for k, v in spec.env.items()}},
                start_new_session=True,
            )
        except OSError as err:
            self.log.close()
            raise ServerError(f"server {spec.name}: cannot run its command {cmd!r}: {err.strerror}") from None

    def _last_log_line(self) -> str:
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1][-200:] if lines else "(no output yet)"

    def _health(self, timeout: float) -> str | None:
        """None when the health path answers 200, else what happened instead."""
        try:
            status = httpx.get(self.url + self.spec.health_path, timeout=timeout).status_code
        except httpx.HTTPError as err:
            return f"{type(err).__name__}: {err}"
        return None if status == 200 else f"HTTP {status}"

    def wait_healthy(self) -> None:
        if self.proc is None:
            self._check_external()
            return
        limit = self.spec.startup_timeout_s
        started = time.monotonic()
        said = started
        _say(
            f"started server {self.spec.name}; waiting up to {limit:g} s for {self.url}{self.spec.health_path} "
            f"(log: {self.log_path})"
        )
        while time.monotonic() - started < limit:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"server {self.spec.name} exited with {self.proc.returncode} before it was healthy "
                    f"(log {self.log_path}: {self._last_log_line()})"
                )
            if self._health(5) is None:
                _say(f"server {self.spec.name} healthy after {time.monotonic() - started:.0f} s")
                return
            if time.monotonic() - said >= PROGRESS_EVERY_S:
                said = time.monotonic()
                _say(
                    f"still waiting for server {self.spec.name}: {said - started:.0f} s of {limit:g} s; "
                    f"its log says: {self._last_log_line()}"
                )
            time.sleep(0.5)
        raise ServerError(
            f"server {self.spec.name} not healthy at {self.url} within {limit:g} s (startup_timeout_s; "
            f"log {self.log_path}: {self._last_log_line()})"
        )

    def _check_external(self) -> None:
        """A server the gate did not start is up already: a health check of seconds, not a startup wait."""
        limit = self.spec.health_timeout_s
        deadline = time.monotonic() + limit
        while True:
            why = self._health(max(0.5, min(5.0, deadline - time.monotonic())))
            if why is None:
                return
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"server {self.spec.name} at {self.url}: {self.spec.health_path} did not answer 200 "
                    f"within {limit:g} s (health_timeout_s; last: {why}); a url: server must be running "
                    "before the gate starts (or give command: and the gate starts it)"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
