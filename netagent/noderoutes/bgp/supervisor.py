"""`BirdSupervisor`: BIRD 2 as a child process of the agent, in the agent's network namespace.

BIRD runs in the foreground (`bird -f`) with its own configuration file, control socket, pid
file and log under one state directory (`--bgp-state-dir`, default `owned.BIRD_STATE_DIR`), so
it never meets a host-wide BIRD. A monitor thread waits on the child and starts it again when
it dies, after an exponential backoff (`restart_delay`) that resets once BIRD has run a while.

Configuration changes never restart BIRD: the text is checked by `bird -p` first (a text BIRD
refuses never replaces a good file), written atomically (temp file, fsync, rename) and loaded
with `birdc configure`, and only when it differs from what BIRD runs, so sessions stay up.

Graceful restart: BIRD is started again with `-R` (graceful restart recovery) after it died or
when a previous one left its pid file (an agent restart), so the kernel protocol keeps the
routes it finds in our table until the sessions have re-converged (a first start does without:
recovery would hold every route back until all peers answered or the wait expired); the
kernel protocol's `persist` leaves them in place whenever BIRD stops. `stop(withdraw=False)`
(the agent exiting or restarting) kills BIRD with SIGKILL, which sends no BGP notification, so
peers hold our routes for the restart time; `stop(withdraw=True)` (`netagent cleanup`) ends it
with SIGTERM, and BIRD tells its peers to withdraw. A BIRD left by a previous agent (found by
its pid file, still running `bird`) is killed the first way before ours starts.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from netagent.kernel import owned
from netagent.noderoutes.bgp.control import BirdControl, BirdError, BirdHealth

log = logging.getLogger("netagent.bgp.bird")

CONFIG_NAME, SOCKET_NAME, PID_NAME, LOG_NAME = "bird.conf", "bird.ctl", "bird.pid", "bird.log"
STABLE_SECONDS = 60.0     # a BIRD that ran this long resets the backoff
MAX_BACKOFF = 30.0
START_TIMEOUT = 30.0      # for the control socket to answer after a start
COMMAND_TIMEOUT = 30.0


def restart_delay(consecutive_failures: int) -> float:
    """Seconds to wait before starting BIRD again: 0.5, 1, 2, ... up to `MAX_BACKOFF`."""
    return min(MAX_BACKOFF, 0.5 * 2 ** max(0, consecutive_failures - 1))


class BirdSupervisor(BirdControl):
    def __init__(self, state_dir: str | Path = owned.BIRD_STATE_DIR, *, bird: str = "bird",
                 birdc: str = "birdc", launcher: tuple = ()) -> None:
        """`launcher` prefixes BIRD's command line (tests: `ip netns exec NAME`)."""
        self.state_dir = Path(state_dir)
        self.config_path = self.state_dir / CONFIG_NAME
        self.socket_path = self.state_dir / SOCKET_NAME
        self.pid_path = self.state_dir / PID_NAME
        self._bird, self._birdc_path, self._launcher = bird, birdc, tuple(launcher)
        self._lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._started_at = 0.0
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._applied: str | None = None   # the text BIRD was last told to run
        self._restarts = 0
        self._failures = 0
        self._detail = ""

    # ------------------------------------------------------------ process

    def ensure_running(self) -> None:
        """Start BIRD unless it runs or the monitor is bringing it back (its backoff holds)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            if self._monitor is not None and self._monitor.is_alive() and not self._stopping.is_set():
                return
            if not self.config_path.exists():
                raise BirdError(f"no BIRD configuration at {self.config_path}: apply one first")
            self._stopping.clear()
            self._spawn()
            if self._monitor is None or not self._monitor.is_alive():
                self._monitor = threading.Thread(target=self._watch, name="bird-supervisor", daemon=True)
                self._monitor.start()

    def _spawn(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        recovering = self._restarts > 0 or self.pid_path.exists()  # a BIRD of ours ran here before
        self._kill_leftover()
        if self.socket_path.exists():
            self.socket_path.unlink()
        command = [*self._launcher, self._bird, "-f", *(["-R"] if recovering else []), "-c", str(self.config_path),
                   "-s", str(self.socket_path), "-P", str(self.pid_path)]
        with open(self.state_dir / LOG_NAME, "ab") as output:
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                          start_new_session=True)
        self._started_at = time.monotonic()
        try:
            self._wait_ready(self._proc)
        except BirdError:
            if self._proc.poll() is None:  # never leave a BIRD we cannot talk to
                self._proc.kill()
                self._proc.wait()
            raise

    def _wait_ready(self, proc: subprocess.Popen) -> None:
        deadline = self._started_at + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._detail = f"bird exited with {proc.returncode} at start; see {self.state_dir / LOG_NAME}"
                raise BirdError(self._detail)
            if self.socket_path.exists() and self._birdc("show", "status", check=False)[0] == 0:
                self._detail = ""
                log.info("BIRD running (pid %s, socket %s)", proc.pid, self.socket_path)
                return
            time.sleep(0.05)
        raise BirdError(f"BIRD's control socket {self.socket_path} did not answer in {START_TIMEOUT:.0f} s")

    def _kill_leftover(self, sig: int = signal.SIGKILL) -> None:
        """Stop a BIRD a previous agent left running on our pid file: SIGKILL (no notification
        sent, peers hold our routes) unless told otherwise."""
        try:
            pid = int(self.pid_path.read_text().split()[0])
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            return
        if comm == "bird" and (self._proc is None or self._proc.pid != pid):
            log.warning("stopping a leftover BIRD (pid %d, signal %d)", pid, sig)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            for _ in range(200):
                if not Path(f"/proc/{pid}").exists():
                    return
                time.sleep(0.05)

    def _watch(self) -> None:
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None:
                return
            code = proc.wait()
            if self._stopping.is_set():
                return
            with self._lock:
                ran = time.monotonic() - self._started_at
                self._failures = 1 if ran >= STABLE_SECONDS else self._failures + 1
                self._restarts += 1
                self._detail = f"bird exited with {code} after {ran:.1f} s"
                delay = restart_delay(self._failures)
            log.warning("%s; starting it again in %.1f s", self._detail, delay)
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._proc is not None and self._proc.poll() is None:
                    continue  # started meanwhile
                try:
                    self._spawn()
                except (BirdError, OSError) as err:
                    self._detail = str(err)
                    log.warning("BIRD did not start again: %s", err)

    def stop(self, *, withdraw: bool = True) -> None:
        self._stopping.set()
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM if withdraw else signal.SIGKILL)
            try:
                proc.wait(timeout=COMMAND_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        elif proc is None:
            self._kill_leftover(signal.SIGTERM if withdraw else signal.SIGKILL)
        if self._monitor is not None:
            self._monitor.join(timeout=COMMAND_TIMEOUT)
        self._applied = None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    # ------------------------------------------------------------ configuration

    def apply_config(self, text: str) -> bool:
        with self._lock:
            running = self._proc is not None and self._proc.poll() is None
            if running and text == self._applied:
                return False
            if not running and self.config_path.exists() and self.config_path.read_text() == text:
                self._applied = text
                return False
            self._write_checked(text)
            if running:
                code, output = self._birdc("configure", check=False)
                if code != 0 or "Reconfigur" not in output:
                    self._detail = f"birdc configure failed: {output.strip()}"
                    raise BirdError(self._detail)
            self._applied = text
            return True

    def _write_checked(self, text: str) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".bird.conf.", dir=self.state_dir)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            done = subprocess.run([self._bird, "-p", "-c", tmp], capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT)
            if done.returncode != 0:
                raise BirdError(f"BIRD refuses the configuration: {(done.stderr or done.stdout).strip()}")
            os.replace(tmp, self.config_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    # ------------------------------------------------------------ control socket

    def _birdc(self, *args: str, check: bool = True) -> tuple:
        try:
            done = subprocess.run([self._birdc_path, "-s", str(self.socket_path), *args], capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired as err:
            raise BirdError(f"birdc {' '.join(args)} timed out") from err
        output = done.stdout + done.stderr
        failed = done.returncode != 0 or "Unable to connect" in output
        if check and failed:
            raise BirdError(f"birdc {' '.join(args)}: {output.strip()}")
        return (1 if failed else 0), output

    def show_protocols(self) -> str:
        return self._birdc("show", "protocols", "all")[1]

    def health(self) -> BirdHealth:
        running = self.pid is not None
        return BirdHealth(running=running, restarts=self._restarts,
                          detail="" if running and not self._detail.startswith("birdc") else self._detail)
