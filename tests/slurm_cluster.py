"""A throwaway Slurm cluster of the tests' own: munged, slurmctld and two slurmd on this host.

    with SlurmCluster.create() as cluster:
        cluster.run("sbatch", "--parsable", input=script)   # any Slurm command, on this cluster
        cluster.set_node("n1", "down"); cluster.set_node("n1", "resume")

Everything lives in one temporary folder: its own munge key and socket, its own slurm.conf
(SLURM_CONF points the commands at it), free ports, and two logical nodes (`slurmd -N n1`, Debian's
build allows several on one host) with GPU_COUNT GPUs each. Slurm accepts GPU GRES only as
character devices, so each "GPU" is a `mknod c 1 3` (a /dev/null twin) under the folder: Slurm
allots them and sets CUDA_VISIBLE_DEVICES, and the batch script maps the allotted indices to
simulated devices ($ORCHESTRATOR_SIM_GPU_MB). No cgroups: processes are tracked by linuxproc and
tasks are not bound. KillWait is Slurm's default, 30 s, not less: after scancel's SIGTERM a
worker needs a few seconds on a busy machine to re-queue its trials and leave. Where the daemons
are missing, or cannot start (not root), the tests skip with the reason; under CI=true they fail,
as a missing PostgreSQL does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

NODES = ("n1", "n2")
GPU_COUNT = 2
CPUS = 4
MEMORY_MB = 200_000  # configured, not real (config_overrides): the workload class asks per GPU
# A job step's credential lifetime, which is also how long a requeued job waits before it may
# start again: until then the node's slurmd still knows the job as killed and refuses to launch
# it ("Job N already killed, do not launch batch job"), and the job ends with status 1 instead of
# coming back. Slurm's default is 120 s; the tests need no more than a loaded machine's launch.
CRED_EXPIRE = 15
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
APT = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def _binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.is_file()), None
    )


def slurm_conf(folder: Path, host: str, ports: dict[str, int]) -> str:
    nodes = "\n".join(
        f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[node]} "
        f"CPUs={CPUS} RealMemory={MEMORY_MB} Gres=gpu:{GPU_COUNT} State=UNKNOWN"
        for node in NODES
    )
    return f"""\
ClusterName=orchtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports["ctld"]}
AuthType=auth/munge
AuthInfo=socket={folder}/munge/munge.socket,cred_expire={CRED_EXPIRE}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=1
SchedulerParameters=sched_interval=2,bf_interval=2
KillWait=30
MinJobAge=600
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen] = []
        self._outputs: dict[int, Path] = {}

    @classmethod
    @contextlib.contextmanager
    def create(cls) -> Iterator[SlurmCluster]:
        missing = [name for name in DAEMONS if _binary(name) is None]
        if missing:
            _unavailable(f"Slurm is not installed ({', '.join(missing)} missing): {APT}")
        if os.geteuid() != 0:
            _unavailable("the test Slurm cluster runs its daemons as root: run the tests as root")
        folder = Path(tempfile.mkdtemp(prefix="orchestrator-slurm-"))
        cluster = cls(folder)
        try:
            cluster._start()
            yield cluster
        finally:
            cluster._stop()
            shutil.rmtree(folder, ignore_errors=True)

    # --- start and stop ------------------------------------------------------------------

    def _start(self) -> None:
        for sub in ("munge", "state", "dev", *(f"spool/{n}" for n in NODES)):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder / "munge", 0o700)
        host = socket.gethostname().split(".")[0]
        ports = {"ctld": _free_port(), **{node: _free_port() for node in NODES}}
        self.conf.write_text(slurm_conf(self.folder, host, ports))
        gres = ["AutoDetect=off"]
        for node in NODES:
            for index in range(GPU_COUNT):
                device = self.folder / "dev" / f"{node}-gpu{index}"
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device
            gres.append(
                f"NodeName={node} Name=gpu File={self.folder}/dev/{node}-gpu[0-{GPU_COUNT - 1}]"
            )
        (self.folder / "gres.conf").write_text("\n".join(gres) + "\n")
        self._start_munge()
        self._daemon("slurmctld", "-D", "-i")
        for node in NODES:
            self._daemon("slurmd", "-D", "-N", node)
        self._wait_for_nodes()

    def _start_munge(self) -> None:
        munge = self.folder / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._daemon(
            "munged",
            "-F",
            "--force",
            f"--key-file={key}",
            f"--socket={munge}/munge.socket",
            f"--pid-file={munge}/munged.pid",
            f"--log-file={munge}/munged.log",
            f"--seed-file={munge}/munged.seed",
        )
        deadline = time.monotonic() + 20
        while not (munge / "munge.socket").exists():
            self._check_daemons()
            if time.monotonic() > deadline:
                _unavailable("munged did not start: " + self._tail(munge / "munged.log"))
            time.sleep(0.1)

    def _daemon(self, name: str, *args: str) -> None:
        out = self.folder / f"{name}-{len(self._daemons)}.out"
        with open(out, "w") as log:
            daemon = subprocess.Popen(
                [_binary(name) or name, *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._daemons.append(daemon)
        self._outputs[daemon.pid] = out

    def _check_daemons(self) -> None:
        for daemon in self._daemons:
            if daemon.poll() is not None:
                said = self._tail(self._outputs[daemon.pid])
                _unavailable(f"{daemon.args[0]} stopped at start ({daemon.returncode}): {said}")

    def _wait_for_nodes(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_daemons()
            done = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            if set(states) == set(NODES) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.5)
        _unavailable(
            "the test Slurm cluster's nodes did not come up idle: "
            + self._tail(self.folder / "slurmctld.log")
        )

    def _stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--user=root", check=False, timeout=10)
        for daemon in reversed(self._daemons):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in reversed(self._daemons):
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait(timeout=5)
        # Job steps the slurmd left behind (slurmstepd and its tasks), found by our folder.
        self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        marker = str(self.folder)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if f"SLURM_CONF={marker}/slurm.conf".encode() in environ:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(proc.name), signal.SIGKILL)

    @staticmethod
    def _tail(path: Path, lines: int = 5) -> str:
        try:
            return " | ".join(path.read_text().splitlines()[-lines:])
        except OSError:
            return f"(no {path.name})"

    # --- what tests do ---------------------------------------------------------------------

    def run(
        self, *command: str, input: str | None = None, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster."""
        done = subprocess.run(
            list(command),
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed: {done.stderr.strip()}")
        return done

    def set_node(self, node: str, state: str, reason: str = "test") -> None:
        """`scontrol update nodename=NODE state=STATE` (down, resume, drain)."""
        self.run("scontrol", "update", f"nodename={node}", f"state={state}", f"reason={reason}")

    def job_states(self, job: str) -> dict[str, str]:
        """Each array task's id and state (PENDING, RUNNING, ...) as squeue says it; gone = done."""
        done = self.run("squeue", "-h", "-r", "-j", job, "-o", "%i %T", check=False)
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())
