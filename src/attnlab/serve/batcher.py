"""Requests that arrive together, classified in one forward pass by one model thread.

Each request's connection thread hands its texts to :meth:`Batcher.predict` and waits. The
model thread takes the oldest waiting request, then every other one already waiting while
their texts fit in ``max_batch``, runs the classifier once over all of them and hands each its
own predictions. Nothing waits on purpose for company: with one client every request runs
alone at once; under load the requests that queue while a batch runs form the next batch.
The model is only ever touched by this thread, so torch's thread setting and the model's
state are never shared between requests.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Predict = Callable[[list[str]], list[dict[str, Any]]]


class Stopping(Exception):
    """The server is shutting down: a request that came too late for the model thread."""


@dataclass
class Job:
    """One request's texts and, once the model thread is done, its answer or failure."""

    texts: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    result: list[dict[str, Any]] | None = None
    failed: BaseException | None = None


class Batcher:
    """A model thread that runs ``predict`` over batches of waiting requests."""

    def __init__(self, predict: Predict, max_batch: int) -> None:
        self.predict_fn, self.max_batch = predict, max_batch
        self.jobs: queue.Queue[Job | None] = queue.Queue()  # None: stop
        self.held: Job | None = None  # a job taken that did not fit the last batch
        self.running: list[Job] = []  # the batch in the model now
        self.stopping = False
        self.cut_off = False  # cut(): no request is taken or answered by the model any more
        self.lock = threading.Lock()  # a job is finished once, by the model or by cut()
        self.batches = 0  # forward passes run (health route, tests)
        self.thread = threading.Thread(target=self._loop, name="attnlab-model", daemon=True)
        self.thread.start()

    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """``texts``' predictions, computed with whatever else is waiting; a failure of the
        batch (a bug) is raised here, in every request of that batch."""
        job = Job(texts)
        with self.lock:
            if self.cut_off:
                raise Stopping("the server is stopping; retry on its next start")
            self.jobs.put(job)
        job.done.wait()
        if job.failed is not None:
            raise job.failed
        assert job.result is not None
        return job.result

    def waiting(self) -> int:
        """Requests queued for the model thread now."""
        return self.jobs.qsize() + (self.held is not None)

    def close(self, timeout: float | None = None) -> bool:
        """Stop the model thread once the requests queued before this call are answered,
        waiting up to ``timeout`` seconds (None: as long as that takes); whether it stopped."""
        self.jobs.put(None)
        self.thread.join(timeout)
        stopped = not self.thread.is_alive()
        self.cut()  # a request that came after all: answered, not left waiting
        return stopped

    def cut(self) -> int:
        """Answer every request not yet answered, the batch in the model included, with
        :class:`Stopping` at once, and take no more: the model's pass may run on, its answer
        is dropped. How many requests were answered so."""
        with self.lock:
            self.cut_off = True
            pending = [*self.running, *([self.held] if self.held else [])]
            while True:
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    break
                pending += [job] if job is not None else []
            self.jobs.put(None)  # the model thread stops after its pass
            pending = [job for job in pending if not job.done.is_set()]
            for job in pending:
                self._finish(job, failed=Stopping("the server stopped before this request was "
                                                  "answered; retry on its next start"))  # fmt: skip
        return len(pending)

    def _finish(self, job: Job, result: Any = None, failed: BaseException | None = None) -> None:
        """Hand ``job`` its answer or failure unless it already has one (call under lock)."""
        if not job.done.is_set():
            job.result, job.failed = result, failed
            job.done.set()

    def _take(self) -> list[Job]:
        """The next batch: the oldest job, then those already waiting while they fit (empty
        once told to stop)."""
        if self.held is not None:
            first, self.held = self.held, None
        elif self.stopping or (first := self.jobs.get()) is None:  # type: ignore[assignment]
            return []
        batch, size = [first], len(first.texts)
        while not self.stopping:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self.stopping = True
            elif size + len(job.texts) > self.max_batch:
                self.held = job  # the next batch starts with it
                break
            else:
                batch.append(job)
                size += len(job.texts)
        return batch

    def _loop(self) -> None:
        self._run()
        late = [self.held] if self.held is not None else []
        while True:  # requests that came after the stop: answered, not left waiting
            try:
                late.append(self.jobs.get_nowait())
            except queue.Empty:
                break
        with self.lock:
            for job in late:
                if job is not None:
                    self._finish(job, failed=Stopping("the server is stopping; retry on its "
                                                      "next start"))  # fmt: skip

    def _run(self) -> None:
        while True:
            with self.lock:
                if self.cut_off:
                    return
            batch = self._take()
            if not batch:
                return
            with self.lock:
                self.running = batch
                if self.cut_off:  # cut() came while the batch was taken: it missed them
                    for job in batch:
                        self._finish(job, failed=Stopping("the server is stopping; retry on "
                                                          "its next start"))  # fmt: skip
                    return
            texts = [t for job in batch for t in job.texts]
            try:
                preds = self.predict_fn(texts)
            except BaseException as err:  # a bug: every request of the batch is told
                traceback.print_exc()
                with self.lock:
                    for job in batch:
                        self._finish(job, failed=err)
                    self.running = []
                continue
            finally:
                self.batches += 1
            with self.lock:
                start = 0
                for job in batch:
                    self._finish(job, result=preds[start : start + len(job.texts)])
                    start += len(job.texts)
                self.running = []
