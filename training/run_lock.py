"""One trainer per run folder: ``<run_dir>/train.lock``.

The lock is an advisory ``flock`` on that file, which the kernel releases when its process ends, however it
ends (kill -9 included): a lock left by a dead trainer is never "held". The file also says who holds it
(pid, host, command, start time), so a second trainer on the same run folder fails at once naming the
first, and a trainer that finds the file of a dead one takes it over and says so. A finished or
interrupted run removes the file. Where ``flock`` is missing (no ``fcntl``) or refused by the file system,
the pid in the file decides: held while that process runs on this host.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: the pid fallback below
    fcntl = None

LOCK_NAME = "train.lock"


class RunLocked(RuntimeError):
    """Another live trainer holds the run folder's lock."""

    def __init__(self, message: str, holder: dict) -> None:
        super().__init__(message)
        self.holder = holder


def lock_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOCK_NAME


def read_holder(path: Path) -> dict:
    """What the lock file says about its holder ({} when empty or unreadable)."""
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_holder(holder: dict) -> str:
    if not holder.get("pid"):
        return "another trainer (it is starting: its lock file is not written yet)"
    return (f"pid {holder['pid']} on {holder.get('host', '?')} ({holder.get('command', '?')}), "
            f"running since {holder.get('started', '?')}")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


class RunLock:
    """``acquire()`` the run folder's lock (RunLocked if a live trainer holds it; returns a note when it took
    over the file of a dead one), ``release()`` it when the run ends."""

    def __init__(self, run_dir: str | Path, command: str | None = None) -> None:
        self.path = lock_path(run_dir)
        self.command = command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self._fd: int | None = None
        self._pid_only = False

    def _info(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}

    def _locked(self, holder: dict) -> RunLocked:
        run_dir = self.path.parent
        stop = f"stop it (kill {holder['pid']}: it saves a checkpoint and exits), " if holder.get("pid") else ""
        return RunLocked(f"{run_dir} is in use by {describe_holder(holder)}. Wait for it to finish, {stop}"
                         f"or choose another run_dir", holder)

    def acquire(self) -> str | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            return self._acquire_by_pid()
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise self._locked(read_holder(self.path)) from None
                return self._acquire_by_pid()  # ENOLCK, EOPNOTSUPP: this file system has no flock
            # a holder releasing the lock unlinks the file: the one locked must still be the one at the path
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = read_holder(self.path)
        self._write(fd)
        self._fd = fd
        return self._takeover_note(previous)

    def _acquire_by_pid(self) -> str | None:
        previous = read_holder(self.path)
        if (previous.get("pid") and previous.get("host") == socket.gethostname()
                and previous["pid"] != os.getpid() and process_alive(int(previous["pid"]))):
            raise self._locked(previous)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._write(fd)
        self._fd, self._pid_only = fd, True
        return self._takeover_note(previous)

    def _write(self, fd: int) -> None:
        data = (json.dumps(self._info()) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)

    def _takeover_note(self, previous: dict) -> str | None:
        if not previous.get("pid"):
            return None
        gone = "no longer running" if not process_alive(int(previous["pid"])) else "no longer holding it"
        return (f"took over {self.path} from pid {previous['pid']} ({previous.get('command', '?')}, started "
                f"{previous.get('started', '?')}), {gone}: that run stopped without releasing it (kill -9 or a crash)")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if read_holder(self.path).get("pid") == os.getpid():
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
