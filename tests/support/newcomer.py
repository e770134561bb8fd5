"""A newcomer's terminal, for the tutorial's test (tests/project/test_tutorial.py).

:func:`steps` reads docs/tutorial.md in order: each ``$ `` line of a ``console``
block is a command, each block with a ``title="..."`` is a file to save. A
:class:`Terminal` does them in a folder outside the checkout, as a shell would:
``cd`` and ``. .venv/bin/activate`` change its state, ``uvicorn ...`` runs in the
background (the tutorial's first terminal) until the next ``uvicorn`` or the end,
and every other command runs to its end and must succeed (the second terminal).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
_TITLE = re.compile(r'title="([^"]+)"')


@dataclass(frozen=True)
class Command:
    """A line the reader types, and the output the page shows after it."""

    line: str
    shown: str


@dataclass(frozen=True)
class File:
    """A file the reader saves, whole."""

    name: str
    text: str


def steps(markdown: str) -> Iterator[Command | File]:
    """The page's commands and files, in the order the reader meets them."""
    for language, attributes, body in _BLOCK.findall(markdown):
        title = _TITLE.search(attributes)
        if title:
            yield File(title.group(1), body)
        elif language == "console":
            yield from _commands(body)


def _commands(body: str) -> Iterator[Command]:
    line: str | None = None
    shown: list[str] = []
    for text in body.splitlines():
        if text.startswith("$ "):
            if line is not None:
                yield Command(line, "\n".join(shown))
            line, shown = text[2:], []
        else:
            shown.append(text)
    if line is not None:
        yield Command(line, "\n".join(shown))


def _program(words: list[str]) -> str:
    """The command a line runs, past its ``NAME=value`` assignments."""
    return next((word for word in words if not re.match(r"\w+=", word)), "")


@dataclass
class Server:
    """The app the reader started in the first terminal."""

    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, ready: Callable[[str], bool], timeout: float, what: str) -> str:
        """The log once ``ready`` holds for it; fails with the log after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if ready(text):
                return text
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the app exited ({self.process.returncode}) before {what}:\n{text}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout} s:\n{text}")
            time.sleep(0.2)

    def interrupt(self) -> int:
        """Ctrl-C, as the terminal sends it: SIGINT to its foreground group."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout=60)


@dataclass
class Terminal:
    """The reader's shell: a folder, an environment, and the app in the background."""

    cwd: Path
    env: dict[str, str]
    server: Server | None = None
    ran: list[tuple[Command, str]] = field(default_factory=list)

    @classmethod
    def fresh(cls, home: Path) -> Terminal:
        """A shell that has never seen this checkout: no virtual environment active,
        nothing of the suite's on PATH, no extra place for pip to look."""
        ours = {str(Path(sys.executable).parent), str(Path(sys.prefix) / "bin")}
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not key.startswith("COV")
        }
        env["PATH"] = os.pathsep.join(
            part for part in env.get("PATH", "").split(os.pathsep) if part not in ours
        )
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        return cls(home, env)

    def save(self, file: File) -> None:
        (self.cwd / file.name).write_text(file.text)

    def run(self, command: Command) -> str:
        """Does the command as a shell would; answers what it printed on stdout."""
        words = shlex.split(command.line)
        if words[0] == "cd":
            self.cwd = (self.cwd / words[1]).resolve()
            out = ""
        elif words[0] in (".", "source"):
            self._activate(self.cwd / words[1])
            out = ""
        elif _program(words) == "uvicorn":
            self._serve(command.line)
            out = ""
        else:
            done = subprocess.run(
                ["bash", "-c", command.line],
                cwd=self.cwd,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            # What the page shows is stdout: curl's progress meter goes to stderr.
            out = done.stdout
            assert done.returncode == 0, (
                f"$ {command.line}\nexit {done.returncode}\n{out}{done.stderr}"
            )
        self.ran.append((command, out))
        return out

    def _activate(self, script: Path) -> None:
        venv = script.parent.parent
        assert (venv / "bin" / "python").exists(), f"no virtual environment at {venv}"
        self.env["VIRTUAL_ENV"] = str(venv)
        self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env['PATH']}"

    def _serve(self, line: str) -> None:
        self.stop()
        log = self.cwd / f"terminal-{len(self.ran)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-c", line],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own, as a terminal's job
            )
        self.server = Server(process, log)
        workers = int(m.group(1)) if (m := re.search(r"--workers (\d+)", line)) else 1
        self.server.wait_for(
            lambda text: text.count("Application startup complete.") >= workers,
            timeout=60,
            what=f"startup of {workers} worker(s)",
        )

    def stop(self) -> None:
        """Ctrl-C in the first terminal: the app shuts down cleanly, or fails the test."""
        server, self.server = self.server, None
        if server is not None:
            code = server.interrupt()
            assert code == 0, f"the app exited {code} on Ctrl-C:\n{server.text()}"

    def kill(self) -> None:
        """Whatever is left, at the end of a failed test."""
        if self.server is not None and self.server.process.poll() is None:
            os.killpg(self.server.process.pid, signal.SIGKILL)
            self.server.process.wait()
