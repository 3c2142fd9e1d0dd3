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
        self.stopping = False
        self.batches = 0  # forward passes run (health route, tests)
        self.thread = threading.Thread(target=self._loop, name="attnlab-model", daemon=True)
        self.thread.start()

    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """``texts``' predictions, computed with whatever else is waiting; a failure of the
        batch (a bug) is raised here, in every request of that batch."""
        job = Job(texts)
        self.jobs.put(job)
        job.done.wait()
        if job.failed is not None:
            raise job.failed
        assert job.result is not None
        return job.result

    def waiting(self) -> int:
        """Requests queued for the model thread now."""
        return self.jobs.qsize() + (self.held is not None)

    def close(self) -> None:
        """Stop the model thread once the requests queued before this call are answered."""
        self.jobs.put(None)
        self.thread.join()

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
        while True:  # requests that came after the stop: answered, not left waiting
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.failed = Stopping("the server is stopping; retry on its next start")
                job.done.set()

    def _run(self) -> None:
        while batch := self._take():
            texts = [t for job in batch for t in job.texts]
            try:
                preds = self.predict_fn(texts)
            except BaseException as err:  # a bug: every request of the batch is told
                traceback.print_exc()
                for job in batch:
                    job.failed = err
                    job.done.set()
                continue
            finally:
                self.batches += 1
            start = 0
            for job in batch:
                job.result = preds[start : start + len(job.texts)]
                start += len(job.texts)
                job.done.set()
