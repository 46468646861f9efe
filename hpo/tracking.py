"""MLflow tracking of a study: one parent run per study, one nested run per trial.

A thin user of the project's `MlflowWriter`: trial runs are created, filled and closed on its
ordered background thread, so the training loop only enqueues them; per-step values go
through `TrialMetrics` in batches, so a trial costs a handful of store calls however long it
trains. `Tracker.flush()` waits for all of it; the study calls it before it reports.

A tracking server that stops answering mid-study does not stop it: the writer spools what
the server does not take under the study's work dir and sends it when the server is back;
`python -m hpo.tracking --replay DIR` sends what a study left waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from common.errors import BadInputError
from common.mlflow_replay import replay
from common.mlflow_store import CLIENT_ID_PREFIX, batch_record, metric, stored_run
from common.mlflow_writer import MlflowWriter, Run, RunRef
from common.outage import EXIT_WAIT_SECONDS, TrackingUnreachable, is_outage, send_before_exit
from common.redact import redact
from common.spool import Spool, spool_folders
from common.workdir import WorkDir
from hpo.keys import EXPERIMENT_ATTR, PARENT_ATTR, STATE_REASON_ATTR
from hpo.states import STATE_NAMES, count_states, trial_loss
from trainers.tracking import StepMetrics

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from hpo.config import StudyConfig

NOTE_TAG = "mlflow.note.content"  # the description the UI shows on the run's page
# MLflow run status for each trial state: the runs table shows it in its status column.
STATUS = {"complete": "FINISHED", "pruned": "KILLED", "failed": "FAILED"}


class TrialMetrics(StepMetrics):
    """A trial's per-step metric histories, sent in batches through the study's tracker."""

    def __init__(self, tracker: Tracker, run: Run, flush_seconds: float = 30.0) -> None:
        super().__init__(tracker.writer, run, flush_seconds=flush_seconds)


class Tracker:
    """The study's MLflow side.

    Args:
        tracking_uri: MLflow tracking URI.
        experiment_name: The study's experiment, created when missing.
        artifact_dir: Where a new experiment keeps its artifacts (not for HTTP stores).
        spool_dir: Where records wait while the tracking server does not answer (None: a
            write that fails fails the study).
        outage: At start, a server that does not answer: ``spool`` (start all the same,
            everything waits in `spool_dir`) or ``fail`` (stop with one line).

    Raises:
        BadInputError: The tracking store cannot be used.
        TrackingUnreachable: The server does not answer and `outage` is ``fail``.
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        *,
        artifact_dir: str | Path | None = None,
        spool_dir: str | Path | None = None,
        outage: str = "spool",
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.writer = MlflowWriter(tracking_uri, spool_root=spool_dir)
        artifacts = None if artifact_dir is None else str(artifact_dir)
        self.offline = False  # started while the server did not answer
        # Open trial runs that could not be looked for while the server was away.
        self._unreconciled: tuple[str, optuna.Study] | None = None
        try:
            self.experiment_id = self.writer.experiment(experiment_name, artifact_dir=artifacts)
        except TrackingUnreachable as exc:
            if outage != "spool" or spool_dir is None:
                # Only a study keeps records on disk (a spool folder): say so only there.
                spool = (
                    ", or pass --tracking-outage spool to keep records on disk until it answers"
                    if spool_dir is not None
                    else ""
                )
                raise TrackingUnreachable(
                    f"{exc}: start it or point --tracking-uri at one that answers{spool}"
                ) from None
            log.warning("%s: the study starts all the same; records wait on disk", exc)
            self.offline = True
            self.experiment_id = self.writer.experiment_later(
                experiment_name, artifact_dir=artifacts
            )
            return
        if spool_dir is not None:
            self._send_left_behind(spool_dir)

    @classmethod
    def for_study(cls, config: StudyConfig, *, spool: bool = True) -> Tracker:
        """The study's tracker: its store (default: SQLite in the work dir), experiment and
        artifact folder; with `spool`, records wait in the work dir while the server is away."""
        work = WorkDir(config.work_dir)
        return cls(
            config.tracking.uri or work.mlflow_url,
            config.tracking.experiment_name or "hpo-lora",
            artifact_dir=work.artifacts,
            spool_dir=work.spool if spool else None,
            outage=config.tracking.outage,
        )

    def _send_left_behind(self, spool_dir: str | Path) -> None:
        """Records an earlier process of this work dir left waiting for this server go now."""
        for folder in spool_folders(Path(spool_dir)):
            try:
                if Spool.meta(folder).get("tracking_uri") != redact(self.tracking_uri):
                    continue
                sent, _ = replay(folder, self.tracking_uri)
            except BadInputError as exc:  # still away, or held by a live worker
                log.warning("%s", exc)
                continue
            if sent:
                log.warning("sent %d MLflow records an earlier run left in %s", sent, folder)

    @property
    def client(self) -> MlflowClient:
        """The writer's client, for the study's reads (search, get) and run bookkeeping."""
        return self.writer.client

    def flush(self) -> None:
        """Wait until everything queued is in the store; raise the first failure."""
        self.writer.flush()

    # -- the study's parent run --------------------------------------------------------------
    def ensure_parent(self, study: optuna.Study, params: Mapping[str, Any]) -> str:
        """The study's parent run, shared by every worker and every resumed run.

        Workers starting at the same moment may each create one; all of them then adopt the
        oldest parent run of the study (ties broken by run id) and the others are deleted,
        so the study keeps exactly one.
        """
        if self.offline:
            return self._offline_parent(study, params)
        run_id = study.user_attrs.get(PARENT_ATTR)
        try:
            known = bool(run_id) and stored_run(self.client, str(run_id)) is not None
        except Exception as exc:
            if not is_outage(exc):
                raise
            # The server went away between the experiment and this call (another worker's
            # start, a restart): as a start while it was away.
            return self._offline_parent(study, params)
        if known:
            # Queued: a server that stops answering now makes it wait in the spool.
            self.writer.update_run(str(run_id), "RUNNING")
            return str(run_id)
        try:
            mine = self.writer.create_run(
                self.experiment_id,
                run_name=study.study_name,
                tags={"hpo.study_name": study.study_name, "hpo.role": "study"},
            )
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning(
                "MLflow tracking server %s stopped answering: the study's parent run waits "
                "on disk", redact(self.tracking_uri)
            )
            return self._offline_parent(study, params)
        try:
            candidates = self.client.search_runs(
                [self.experiment_id], filter_string=_parent_filter(study.study_name), max_results=100
            )
        except Exception as exc:
            if not is_outage(exc):
                raise
            # Its own run exists in the store: it is the parent, as when no other worker
            # started at the same moment (the one case where the study could hold two).
            self.writer.log_batch(mine, params=params)
            study.set_user_attr(PARENT_ATTR, mine)
            study.set_user_attr(EXPERIMENT_ATTR, self.experiment_id)
            return mine
        winner = min(candidates, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
        if winner != mine:
            try:
                self.client.delete_run(mine)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # Every start adopts the oldest parent, so the study still has one in use.
                log.warning("an empty parent run %s stays: the server stopped answering", mine)
        else:
            self.writer.log_batch(mine, params=params)
        study.set_user_attr(PARENT_ATTR, winner)
        study.set_user_attr(EXPERIMENT_ATTR, self.experiment_id)
        return str(winner)

    def _offline_parent(self, study: optuna.Study, params: Mapping[str, Any]) -> str:
        """A parent run that waits in the spool: sent, it becomes the study's existing one."""
        known = study.user_attrs.get(PARENT_ATTR)
        if known and not str(known).startswith(CLIENT_ID_PREFIX):
            self.writer.update_run(str(known), "RUNNING")
            return str(known)
        ref = self.writer.create_run_later(
            self.experiment_id,
            run_name=study.study_name,
            tags={"hpo.study_name": study.study_name, "hpo.role": "study"},
            adopt=_parent_filter(study.study_name),
        )
        self.writer.log_batch(ref, params=params)
        return ref.result()

    def reconcile(self, parent_run_id: str, study: optuna.Study) -> int:
        """Close trial runs left open by a worker that died or was interrupted.

        Optuna is the record of what happened (with heartbeats, a dead worker's trial is
        failed and retried); its state is copied onto the run. Returns how many were closed.
        """
        self.flush()
        if self.writer.waiting:
            # The server is away: tried again when the study closes, else at a later start.
            self._unreconciled = (parent_run_id, study)
            return 0
        self._unreconciled = None
        # A study that started while the server was away holds client-side ids until its
        # spool is sent; the store knows only its own.
        experiment, parent = self.writer.resolve(self.experiment_id), self.writer.resolve(parent_run_id)
        try:
            open_runs = self.client.search_runs(
                [experiment],
                filter_string=f"tags.mlflow.parentRunId = '{parent}' and tags.state = 'running'",
                max_results=1000,
            )
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("open trial runs not closed: %s", redact(str(exc).splitlines()[0]))
            return 0
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        closed = 0
        for run in open_runs:
            trial = trials.get(int(run.data.tags.get("hpo.trial_number", -1)))
            if trial is None or trial.state not in STATE_NAMES:
                continue  # still running in some worker
            state = STATE_NAMES[trial.state]
            reason = (
                trial.user_attrs.get(STATE_REASON_ATTR) or "the worker stopped before recording it"
            )
            self.end_trial(run.info.run_id, state, tags={"reason": reason})
            closed += 1
        self.flush()
        return closed

    def update_parent(self, parent_run_id: str, study: optuna.Study) -> None:
        """Queue the parent's best value so far and counts per state (read from the study)."""
        # Reading the study costs a storage round trip: it is done on the writer's thread too.
        self.writer.submit(self._update_parent_now, parent_run_id, study)

    def _update_parent_now(self, parent_run_id: str, study: optuna.Study) -> None:
        trials = study.get_trials(deepcopy=False, states=tuple(STATE_NAMES))
        counts = count_states(trials)
        finished = len(trials)
        metrics = [metric(f"n_{k}", v, finished) for k, v in counts.items()]
        tags: dict[str, Any] = {}
        losses = [
            (loss, t.number)
            for t in trials
            if t.state == optuna.trial.TrialState.COMPLETE and (loss := trial_loss(t)) is not None
        ]
        if losses:
            best_loss, best_number = min(losses)
            metrics.append(metric("best_value", best_loss, finished))
            tags["best_trial"] = best_number
        self.writer.write(parent_run_id, batch_record(metrics, tags=tags))

    # -- trials ------------------------------------------------------------------------------
    def start_trial(
        self, parent_run_id: str, study_name: str, trial_number: int, params: Mapping[str, Any]
    ) -> RunRef:
        """Queue the trial's nested run; the returned future holds its run id."""
        tags = {
            "mlflow.parentRunId": parent_run_id,
            "hpo.study_name": study_name,
            "hpo.trial_number": str(trial_number),
            "state": "running",
        }
        run = self.writer.create_run_later(
            self.experiment_id, run_name=f"trial-{trial_number:03d}", tags=tags
        )
        self.writer.log_batch(run, params={"trial_number": trial_number, **params})
        return run

    def continue_trial(self, run_id: str, trial_number: int) -> RunRef:
        """Reopen a trial's run for its promotion: the configuration's curves stay in one run.

        The promoted trial trains its configuration again from the start (same schedule,
        same data order, so its first points repeat the earlier ones) and further.
        """
        ref: RunRef = Future()
        ref.set_result(run_id)
        self.writer.update_run(run_id, "RUNNING")
        self.writer.log_batch(
            ref, tags={"state": "running", "hpo.promoted_trial_number": str(trial_number)}
        )
        return ref

    def end_trial(
        self,
        run: Run,
        state: str,
        *,
        metrics: Mapping[str, float] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue the trial's final values and closing its run with the status of `state`."""
        final = [metric(k, v, 0) for k, v in (metrics or {}).items()]
        self.writer.log_batch(run, metrics=final, tags={"state": state, **(tags or {})})
        self.writer.set_terminated(run, STATUS[state])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file (or a folder's files) to the run once everything queued is stored."""
        self.writer.log_artifact(run_id, path, artifact_path)

    def note(self, run: Run, text: str) -> None:
        """The run's description in the MLflow UI (its note), one sentence."""
        self.writer.log_batch(run, tags={NOTE_TAG: text})

    def finish_parent(
        self,
        parent_run_id: str,
        *,
        exit_wait_seconds: float = EXIT_WAIT_SECONDS,
        last: Callable[[], None] | None = None,
    ) -> int:
        """Close the study's parent run and wait until everything is stored or spooled.

        Args:
            parent_run_id: The study's parent run.
            exit_wait_seconds: How long to wait for a server that does not answer to take
                what waits in the spool (said in one line).
            last: Records written once everything queued before is stored, just before the
                run closes (what the search spent, its close included).

        Returns:
            Records still waiting for the server (in `spool_folder`).
        """
        if last is not None:
            self.writer.flush()
            last()
        self.writer.set_terminated(parent_run_id, "FINISHED")
        self.writer.flush()
        waiting = send_before_exit(self.writer, exit_wait_seconds)
        if self._unreconciled is not None and not waiting:
            self.reconcile(*self._unreconciled)  # the server is back: close them now
        return self.writer.close()

    @property
    def spool_folder(self) -> str | None:
        """Where this study's records wait for the server, if any had to."""
        folder = self.writer.spool_folder
        return str(folder) if folder is not None else None


def _parent_filter(study_name: str) -> str:
    """The `search_runs` filter that finds a study's parent runs."""
    return f"tags.`hpo.study_name` = '{study_name}' and tags.`hpo.role` = 'study'"


def main(argv: list[str] | None = None) -> int:
    """`python -m hpo.tracking --replay DIR`: send MLflow records a run left waiting."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m hpo.tracking",
        description="Send MLflow records that waited on disk while the tracking server was away.",
    )
    parser.add_argument(
        "--replay",
        required=True,
        metavar="DIR",
        help="A spool folder, or the folder holding them (a work dir's mlflow-spool).",
    )
    parser.add_argument(
        "--tracking-uri", help="Where to send them. Default: the URI the spool recorded."
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    sent, waiting = replay(args.replay, args.tracking_uri)
    print(f"sent {sent} MLflow records; {waiting} still waiting")
    return 0


if __name__ == "__main__":
    import sys

    from common.cli import run_cli

    sys.exit(run_cli(main))
