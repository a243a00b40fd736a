"""Docker backend: the harness in the device class's image, on a local, ssh:// or GPU engine.

The container is confined: no network, a read-only root filesystem, a non-root
user, a tmpfs /tmp, no capabilities, the device's memory (`memory_limit_mb`, or
[container] memory) as Docker's memory limit (swap included), a pids limit, and a
wall-clock timeout (kill + failed result). A run the kernel kills at the memory
limit is an out-of-memory finding: a failed result naming the limit, with
`oom_limit_bytes` set (the gate turns it into a memory check for that class).

Data travel through two job volumes, not bind mounts, so the same code serves a
remote engine whose filesystem is not ours: the evaluation .npz is copied into
the input volume (mounted read-only at /data), the harness writes to the output
volume (/out/<n>/ for the n-th job), and the host copies result.json and
outputs.npz back.

Several artifacts on one class (`run_many`: candidate, reference, incumbent) run in
ONE container: the first job's image, with the other artifacts' files copied into
the input volume (/data/m<n>/): one start, one runtime import, one data load. The
harness forks a child per artifact, so each keeps its own memory figures, its own
crash and its own timeout (the class's `timeout_s`, enforced by the harness: a hung
candidate times out alone); what one child finished is kept when a later one (or the
container) fails. An image that is gone from the engine (removed under the gate) raises
`ImageGone` (exit 2): never a failed run.
"""

from __future__ import annotations

import os
import re
import signal
import shutil
import threading
import time
import tarfile
import tempfile
import uuid
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

from tiergate.execution.dockersdk import docker
import requests

from tiergate.images import LABEL
from tiergate.errors import InfrastructureFault, InputError
from tiergate.execution.base import (FAILED_FILE, LOG_TAIL_LINES, ImageGone, Job, clear_outputs, exit_reason,
                                     harness_command, harness_spoke, host_fields, last_line, python_entrypoint,
                                     read_harness_result, start_timeout, tail)
from tiergate.execution import counting, janitor
from tiergate.execution.engine import DEFAULT_ATTEMPTS, DEFAULT_BACKOFF_S, connect, engine_problem, with_retries
from tiergate.results import OUTPUT_LIMIT_BYTES, OUTPUTS_FILE, RESULT_FILE, TargetResult, failed  # noqa: F401 - re-exported
from tiergate.results import save as results_save
from tiergate.runtime_graph import DESCRIBE_FILE, described_level

USER = "65534:65534"  # nobody:nogroup
_DONE = re.compile(r"^harness: finished artifact (\d+)$", re.MULTILINE)   # the harness's DONE_MARK
CONTAINER_ENV = "TIERGATE_IN_CONTAINER"   # tells the harness the cgroup is the run's own (harness_memory.py)
DATA_NAME = "data.npz"
TMPFS = "rw,nosuid,nodev,size=64m,mode=1777"
# The most one output file (outputs.npz, result.json) may hold (results.OUTPUT_LIMIT_BYTES, one run's outputs):
# enforced in the container (RLIMIT_FSIZE: a larger write kills the harness with SIGXFSZ), again when copying
# back, and on the arrays' sizes before the host loads them (base.read_harness_result).


class DockerBackend:
    name = "docker"
    takes_samples = True      # runs a range of the samples (Job.samples): shards
    takes_slot_hooks = True   # calls Job.on_start / on_exited around the harness's own run
    spreads_calls = True      # a harness with eval_workers > 1 gets further call slots while it runs (Job.on_running)

    def __init__(self, docker_host: str = "local", *, gpu: bool = False, attempts: int = DEFAULT_ATTEMPTS,
                 backoff_s: float = DEFAULT_BACKOFF_S, use_ssh_client: bool = False):
        self.docker_host = docker_host
        self.gpu = gpu
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.use_ssh_client = use_ssh_client

    def run(self, job: Job) -> TargetResult:
        return self.run_many([job])[0]

    def run_many(self, jobs: list[Job]) -> list[TargetResult]:
        """Jobs of one class on the same samples in one container (see the module's docstring); a result each."""
        dc = jobs[0].device_class
        for job in jobs:
            if job.image is None:
                raise InputError(f"{dc.name}: the Docker backend needs a built image (tiergate.build.build_image)")
        if len(jobs) > 1 and not _shareable(jobs):     # artifacts of different runtime images: one start each
            return [result for job in jobs for result in self.run_many([job])]
        hosts = [host_fields(job) for job in jobs]
        try:
            return with_retries(lambda: self._attempt(jobs, hosts), attempts=self.attempts,
                                backoff_s=self.backoff_s, what=f"{dc.name} on {self.docker_host}")
        except InfrastructureFault as exc:
            return [failed(dc.name, exc.message, **host) for host in hosts]
        except docker.errors.ImageNotFound:
            raise ImageGone(f"{dc.name}: image {jobs[0].image.tag} is no longer on the engine {self.docker_host} "
                            f"(removed while the gate ran: tiergate gc or docker rmi)",
                            hint="run the gate again: it builds the image again") from None

    def engine_problem(self) -> str | None:
        """Why this backend's engine does not answer, or None when it does (asked after a failed run)."""
        return engine_problem(self.docker_host, use_ssh_client=self.use_ssh_client)

    # one attempt: any engine fault raised from here is retried by run_many()
    def _attempt(self, jobs: list[Job], hosts: list[dict]) -> list[TargetResult]:
        for job in jobs:
            clear_outputs(job.out_dir)
        janitor.check_stop()
        client = connect(self.docker_host, use_ssh_client=self.use_ssh_client)
        janitor.note_engine(self.docker_host)
        first = jobs[0]
        try:
            info = client.info()
            engine_machine = info.get("Architecture", "")
            with _job_volumes(client) as (data_volume, out_volume):
                files, models, partners = _job_files(jobs)
                janitor.check_stop()
                container = client.containers.create(**self.spec(first, data_volume, out_volume,
                                                                 engine_cpus=info.get("NCPU"), models=models,
                                                                 partners=partners, ready=READY_NAME))
                # the files go in while the container waits for its run slot, and while its harness imports the
                # runtime (a second under QEMU); the harness reads them once READY_NAME, the last, is there
                copying = _copy_beside(client, _image_ref(first), data_volume, files)
                container_id = container.id[:12]
                collected: dict[int, TargetResult] = {}

                def collect(oom: bool = False) -> None:
                    """Read back each artifact the harness says it finished, while the container runs on: a
                    stop (or a later artifact's failure) then loses nothing already measured."""
                    logs = container.logs().decode("utf-8", "replace")
                    for n in sorted({int(m) for m in _DONE.findall(logs)} - set(collected)):
                        job = jobs[n]
                        download(container, job.out_dir, _wanted, folders={str(n): job.out_dir}, path=f"/out/{n}")
                        result = _check_machine(read_harness_result(job, hosts[n], "", oom=oom), job, engine_machine)
                        result.extra = {**result.extra, "container": {"id": container_id, "artifacts": len(jobs)}}
                        collected[n] = result
                        if result.ok:
                            results_save(result, job.out_dir)
                            if job.on_done is not None:
                                job.on_done(result)

                try:                       # a stop before the start (_run checks): the finally removes it
                    reason, log_tail, oom = _run(container, first, runs=len(jobs),
                                                 poll=collect if len(jobs) > 1 else None, started=copying.result)
                    if reason is None or len(jobs) > 1:   # what finished before a failure is kept
                        _download(container, [job for n, job in enumerate(jobs) if n not in collected],
                                  [n for n in range(len(jobs)) if n not in collected])
                finally:
                    futures.wait([copying])     # its helper container leaves the volume before the volume goes
                    try:
                        container.remove(force=True)
                    except docker.errors.NotFound:    # removed already: a stop's sweep (janitor.remove_own)
                        pass
        finally:
            client.close()
        done = []
        for n, (job, host) in enumerate(zip(jobs, hosts)):
            if n in collected:
                done.append(collected[n])
                done[-1].log_tail = log_tail if not done[-1].ok else ""
                continue
            if reason is not None and (len(jobs) == 1 or not harness_spoke(job)):
                done.append(failed(job.device_class.name, reason, log_tail=log_tail,
                                   oom_limit_bytes=job.device_class.limits.memory_bytes if oom else None, **host))
            else:
                done.append(_check_machine(read_harness_result(job, host, log_tail, oom=oom), job, engine_machine))
            done[-1].extra = {**done[-1].extra, "container": {"id": container_id, "artifacts": len(jobs)}}
        return done

    def spec(self, job: Job, data_volume: str, out_volume: str, *, engine_cpus: int | None = None,
             models: list[tuple[Job, str]] | None = None, partners: list[list[str]] | None = None,
             ready: str | None = None) -> dict:
        """The container's create() arguments: the confinement lives here. `models`: (job, model path in the
        container) per job run in it (default: the job alone, its artifact in its image); `ready`: the file of the
        data volume the harness waits for before it reads the data (copied in while it starts: _copy_beside)."""
        dc = job.device_class
        cpus = dc.threads * max(1, job.eval_workers)       # the batched calls' threads at once, each the class's
        cpus = min(cpus, engine_cpus) if engine_cpus else cpus
        models = models or [(job, job.image.model_path)]
        spec = dict(
            image=_image_ref(job),
            command=harness_command([j for j, _ in models], [m for _, m in models], f"/data/{DATA_NAME}",
                                    [f"/out/{n}" for n in range(len(models))], partners)
            + (["--data-ready", f"/data/{ready}"] if ready else []),
            user=USER, read_only=True, tmpfs={"/tmp": TMPFS}, network_mode="none",
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            # an init as PID 1: a harness (or QEMU) that dies of its own signal cannot as PID 1,
            # where the kernel ignores it; QEMU then hangs after "uncaught target signal 11"
            init=True, ulimits=[docker.types.Ulimit(name="core", soft=0, hard=0),
                                docker.types.Ulimit(name="fsize", soft=OUTPUT_LIMIT_BYTES, hard=OUTPUT_LIMIT_BYTES)],
            mem_limit=dc.limits.memory, memswap_limit=dc.limits.memory, pids_limit=dc.limits.pids_limit,
            nano_cpus=int(max(cpus, 1) * 1_000_000_000),
            volumes={data_volume: {"bind": "/data", "mode": "ro"}, out_volume: {"bind": "/out", "mode": "rw"}},
            environment={**dc.container_env, **job.env, CONTAINER_ENV: "1"},
            labels={f"{LABEL}.device_class": dc.name, **janitor.owner_labels()},
        )
        count = counting.counts(dc, self.docker_host) if job.count else None
        if count is not None:     # under the counting QEMU: instructions per inference (execution/counting.py)
            spec["entrypoint"] = [*count.launcher(dc), "/usr/bin/python3", "-s", HARNESS_IN_IMAGE]
            spec["volumes"].update(count.mount())
            spec["environment"].update(count.environment())
        elif dc.launcher:
            spec["entrypoint"] = python_entrypoint(dc, HARNESS_IN_IMAGE)
        if self.gpu:
            spec["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        return spec


HARNESS_IN_IMAGE = "/opt/tiergate/harness/tiergate_harness.py"   # the runtime image's ENTRYPOINT script


def _run(container, job: Job, runs: int = 1, poll=None, started=None) -> tuple[str | None, str, bool]:
    """Start, wait with the start's timeout (base.start_timeout: each artifact's own is the harness's): (why it
    failed or None, log tail, killed out of memory). `started()` is called once it runs (it raises when the
    container's files could not be copied in: _copy_beside); `poll()` as the harness finishes each artifact while
    it runs (and once at the end)."""
    dc = job.device_class
    timeout_s = start_timeout([job] * runs)
    if job.on_start is not None:
        job.on_start()            # the run slot: taken once the container is made and its files are in
    janitor.check_stop()
    if job.cancel is not None:
        job.cancel.check()
    container.start()
    if job.on_running is not None and job.eval_workers > 1:
        job.on_running(_granter(container))
    if started is not None:
        started()               # raised here (not as the wait's engine faults below): the attempt fails
    forget = job.cancel.on_cancel(container.kill) if job.cancel is not None else (lambda: None)
    timed_out = False
    # several artifacts: each read back as the harness finishes it, from its log followed as it comes
    follower = _Follower(container, poll) if poll is not None else None
    try:
        try:
            code = container.wait(timeout=timeout_s)["StatusCode"]      # ReadTimeout after timeout_s
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            container.reload()  # an engine that is gone raises here, and the attempt is retried
            if container.status != "running":
                raise
            container.kill()
            container.wait(timeout=60)
            code, timed_out = None, True
        finally:
            forget()
        if job.on_exited is not None:
            job.on_exited()       # the harness has ended: reading back and removing need no slot
    finally:
        if follower is not None:
            follower.stop()       # a read back under way ends first (after the slot is given back)
    container.reload()
    log_tail = tail(container.logs(tail=LOG_TAIL_LINES).decode("utf-8", "replace"))
    if poll is not None and not timed_out:
        poll(bool(container.attrs["State"].get("OOMKilled")))
    if timed_out:
        return f"timed out after {timeout_s} s", log_tail, False
    oom = bool(container.attrs["State"].get("OOMKilled"))
    if code == 128 + signal.SIGXFSZ and not oom:
        return f"the harness wrote more than the output limit ({OUTPUT_LIMIT_BYTES} bytes per file)", log_tail, False
    if oom or code != 0:
        reason = exit_reason(code, oom=oom, memory=dc.limits.memory)
        if 0 < code < 128 and not oom:
            reason += f": {last_line(log_tail)}"
        return reason, log_tail, oom
    return None, log_tail, False


_READY = "harness: ready for more call slots"     # the harness's READY_MARK: it handles SIGUSR1 from then on
READY_WAIT_S = 120


def _granter(container):
    """grant(): one more batched call at once for the harness running in `container` (SIGUSR1), sent once the
    harness says it handles the signal (before, the signal's default would end it); raises once the container has
    stopped or the mark never came."""
    ready = threading.Event()

    def grant() -> None:
        deadline = time.monotonic() + READY_WAIT_S
        while not ready.is_set():
            if _READY in container.logs(stdout=True, stderr=False).decode("utf-8", "replace"):
                ready.set()
                break
            container.reload()
            if container.status != "running" or time.monotonic() > deadline:
                raise RuntimeError("the harness is not running")
            time.sleep(0.1)
        container.kill(signal="SIGUSR1")
    return grant


class _Follower:
    """A thread reading the container's log as it comes (one stream, no polling) and calling poll() at each
    "finished artifact" line: a finished artifact is read back while the others run. Whatever stops it (the
    engine's stream ending, a read back that fails) leaves the artifact to the last poll, after the exit."""

    JOIN_S = 5.0      # the stream ends with the container: a stream that lingers after it is left to its thread

    def __init__(self, container, poll):
        self.container, self.poll = container, poll
        self.done, self.busy = threading.Event(), threading.Lock()
        self.thread = threading.Thread(target=self.follow, name="tiergate-follow", daemon=True)
        self.thread.start()

    def follow(self) -> None:
        try:
            pending = b""
            for chunk in self.container.logs(stream=True, follow=True):
                pending += chunk
                lines, _, pending = pending.rpartition(b"\n")
                if _DONE.search(lines.decode("utf-8", "replace")):
                    with self.busy:
                        if self.done.is_set():
                            return
                        self.poll()
        except Exception:  # noqa: BLE001 - the last poll, after the exit, reads back what is left
            return

    def stop(self) -> None:
        """Once the container has ended (or the wait failed): a read back under way ends first, so the last poll
        never runs beside it, and no other starts."""
        self.done.set()
        with self.busy:
            pass
        self.thread.join(self.JOIN_S)


def _check_machine(result: TargetResult, job: Job, engine_machine: str) -> TargetResult:
    """Record emulation as measured; a run on the wrong architecture is a failed run."""
    dc = job.device_class
    if not result.ok:
        return result
    result.emulated = dc.emulated or bool(engine_machine and result.machine != engine_machine)
    if result.device is not None:
        result.device.emulated = result.emulated    # QEMU user mode: memory includes the emulator
    if result.machine != dc.machine:
        result.status = "failed"
        result.reason = f"ran as {result.machine}, but {dc.name} is {dc.machine}: check its base image"
    return result


@contextmanager
def _job_volumes(client):
    job_id = uuid.uuid4().hex[:12]
    labels = {f"{LABEL}.job": job_id, **janitor.owner_labels()}
    volumes = [client.volumes.create(f"tiergate-{job_id}-{part}", labels=labels) for part in ("data", "out")]
    try:
        yield volumes[0].name, volumes[1].name
    finally:
        for volume in volumes:
            try:
                volume.remove(force=True)
            except docker.errors.NotFound:
                pass


def _image_ref(job: Job) -> str:
    """What a container is created from: the image's id (the one whose lineage labels were checked), so a
    re-tag between the build and the run cannot swap it; the tag when no id is known."""
    return job.image.image_id or job.image.tag


def upload(client, image: str, volume: str, files: list[tuple[Path, str]], mount: str = "/data",
           ready: str | None = None) -> None:
    """Copy files (host path, name in the volume) into a job volume through a container that never starts; `ready`:
    an empty file written after them (a harness started meanwhile waits for it)."""
    helper = client.containers.create(image, entrypoint=["true"], command=[], network_mode="none",
                                      labels=janitor.owner_labels(), volumes={volume: {"bind": mount, "mode": "rw"}})
    try:
        if not helper.put_archive(mount, readonly_tar_stream(files, ready)):
            raise InfrastructureFault(f"could not copy {', '.join(n for _, n in files)} into the job's volume")
    finally:
        helper.remove(force=True)


def readonly_tar(files: list[tuple[Path, str]], last: str | None = None) -> bytes:
    """A tar of files (host path, name in it) owned by root and readable by anyone (0444), whatever their owner and
    modes on the host: what a container's unprivileged user reads; `last`: an empty file after them (extracted in
    order, it is there once the others are)."""
    return b"".join(readonly_tar_stream(files, last))


TAR_CHUNK = 1 << 20      # bytes of a file per piece of a streamed tar


def readonly_tar_stream(files: list[tuple[Path, str]], last: str | None = None):
    """readonly_tar's archive in pieces, each file read as it is sent (put_archive streams it): no copy of the data
    in memory or in a temporary file (an evaluation archive of 44 MB cost 57-85 ms of the gate's CPU per container
    that way, 9-17 ms streamed)."""
    def header(name: str, size: int, mtime: float) -> bytes:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, int(mtime), 0o444
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")

    for path, name in files:
        with open(path, "rb") as fh:
            stat = os.fstat(fh.fileno())
            yield header(name, stat.st_size, stat.st_mtime)
            left = stat.st_size
            while left:
                piece = fh.read(min(TAR_CHUNK, left))
                if not piece:
                    raise InfrastructureFault(f"{path} shrank while it was copied into the job's volume")
                left -= len(piece)
                yield piece
        if stat.st_size % tarfile.BLOCKSIZE:
            yield tarfile.NUL * (tarfile.BLOCKSIZE - stat.st_size % tarfile.BLOCKSIZE)
    if last is not None:
        yield header(last, 0, time.time())
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)          # the archive's end


def _shareable(jobs: list[Job]) -> bool:
    """One container can run them: one runtime image, and the files of every artifact but the first at hand (a
    compiled artifact's library is in its own image only: tiergate.build.compiling)."""
    runtimes = {job.image.runtime_tag or job.image.tag for job in jobs}
    compiled = any(f"{LABEL}.compile.key" in (job.image.labels or {}) for job in jobs)
    return len(runtimes) == 1 and not compiled and all(job.artifact_path is not None and
                                                       Path(job.artifact_path).is_file() for job in jobs[1:])


def _job_files(jobs: list[Job]) -> tuple[list[tuple[Path, str]], list[tuple[Job, str]], list[list[str]]]:
    """What goes into the data volume: the evaluation .npz, the files of every artifact after the first (its own
    image holds the first), and of the artifacts a job's calls are interleaved with (Job.pair_with); (those files
    (host path, name in the volume), (job, model path in the container) per job, the partners' paths in the
    container per job)."""
    from tiergate.artifact.files import artifact_files

    files, models, partners = [(jobs[0].data_npz, DATA_NAME)], [(jobs[0], jobs[0].image.model_path)], []
    for n, job in enumerate(jobs[1:], start=1):
        paths = artifact_files(job.device_class, Path(job.artifact_path))   # the model and its external data
        files += [(path, f"m{n}/{path.name}") for path in paths]
        models.append((job, f"/data/m{n}/{paths[0].name}"))
    for n, job in enumerate(jobs):
        partners.append([])
        for k, partner in enumerate(job.pair_with if job.pairs > 0 else ()):
            paths = artifact_files(job.device_class, Path(partner))
            files += [(path, f"p{n}-{k}/{path.name}") for path in paths]
            partners[-1].append(f"/data/p{n}-{k}/{paths[0].name}")
    return files, models, partners


READY_NAME = ".tiergate-ready"     # the data volume's last file: the harness (--data-ready) reads the data after it


def _copy_beside(client, image: str, volume: str, files: list[tuple[Path, str]]) -> futures.Future:
    """The job's files copied into its data volume (upload, READY_NAME last) on a thread of its own, while its
    container waits for a run slot and starts: the future's result() re-raises what stopped the copy (the attempt
    fails, its container is removed and the engine's fault retried)."""
    pool = futures.ThreadPoolExecutor(1, thread_name_prefix="tiergate-copy")
    try:
        return pool.submit(upload, client, image, volume, files, ready=READY_NAME)
    finally:
        pool.shutdown(wait=False)


def download(container, out_dir: Path, wanted, folders: dict[str, Path] | None = None, path: str = "/out") -> None:
    """Copy the files of the container's `path` (default /out) whose names `wanted(name)` accepts, within the
    output limit.

    `folders`: files of /out/<key>/ go to folders[key] (else every file goes to out_dir); a `path` /out/<n>
    fetches that folder only (its archive holds the folder <n>/ itself)."""
    stream, _ = container.get_archive("/out/." if path == "/out" else path.rstrip("/"))
    with tempfile.TemporaryFile() as buf:
        for chunk in stream:
            buf.write(chunk)
        buf.seek(0)
        with tarfile.open(fileobj=buf, mode="r") as tar:
            for member in tar.getmembers():
                parts = [p for p in Path(member.name).parts if p not in (".", "")]
                name = parts[-1] if parts else ""
                if folders is not None:
                    if len(parts) != 2 or parts[0] not in folders:
                        continue
                    target = folders[parts[0]]
                else:
                    target = out_dir
                if member.isfile() and wanted(name):
                    if member.size > OUTPUT_LIMIT_BYTES:
                        raise InputError(f"the harness's {name} holds {member.size} bytes, over the output "
                                         f"limit ({OUTPUT_LIMIT_BYTES})")
                    with tar.extractfile(member) as src, open(target / name, "wb") as dst:
                        shutil.copyfileobj(src, dst)


def _wanted(name: str) -> bool:
    """The harness's files: its result (or failure), its outputs, and a runtime graph it described (--describe)."""
    return name in (RESULT_FILE, OUTPUTS_FILE, FAILED_FILE, DESCRIBE_FILE) or described_level(name)


def _download(container, jobs: list[Job], numbers: list[int] | None = None) -> None:
    """result.json, outputs.npz (or the harness's failed.json) of each job, from /out/<n>/."""
    if jobs:
        numbers = numbers if numbers is not None else list(range(len(jobs)))
        download(container, jobs[0].out_dir, _wanted, folders={str(n): job.out_dir for n, job in zip(numbers, jobs)})