// Package client is the Go client of snapcoord, the coordinator that makes
// a training run save its trainer checkpoint and its environment snapshot
// before the walltime runs out.
//
// Dial connects to a coordinator; Client.Runs and Client.Workers are the
// typed RunService and WorkerService stubs, carrying the admin token
// (WithToken) and the run token (WithRunToken) as `authorization: Bearer`
// metadata.
//
// Two helpers cover the processes of a run:
//
//   - StartTrainer registers a trainer rank. Its CompleteStep is the
//     step-loop check ("continue, or save now and stop?", or, in a run with
//     safety saves, "save now and continue") and ReportCheckpoint reports
//     the saved checkpoint. An action the client does not know comes with
//     ErrUnknownAction, never as a silent CONTINUE.
//     CompleteStep takes the step's iteration from the caller: time it
//     from after the previous CompleteStep (or the save it asked for)
//     returned to the end of the step, so that neither the saves (C is
//     measured apart), nor the setup before the first step, nor the time
//     spent waiting for the coordinator enters I, which would stop the run
//     early for the rest of its life. LastCheckpointStep is where a loop
//     resumed from its newest checkpoint without knowing its step (a Slurm
//     requeue) continues.
//   - StartWorker registers any worker (an environment worker, usually) and
//     delivers its commands on a channel.
//
// Both heartbeat in the background and receive commands by streaming,
// falling back to long polling when streaming fails; they resume after the
// last delivered sequence number across disconnects and coordinator
// restarts, register again when their lease lapsed or the coordinator
// dropped them, and deregister on Close. If the coordinator says their
// resume point lies past the end of its log (OUT_OF_RANGE: its state was
// restored or replaced), they read the log again from where a new process
// would start, skipping the commands they already delivered; WatchEvents
// does the same from the afterSeq it was given.
//
// # When the coordinator is out of reach
//
// A trainer follows the fail-safe plan of docs/design.md unless its
// TrainerConfig.FailSafe says Off: once it has had a step answered, a
// CompleteStep that cannot reach the coordinator within W (5 s, waiting
// for the connection, so a restart within it goes unnoticed) returns the
// rank's own decision, never a transport error. The rank projects the
// step's end from the last decision it received (its I, C, R, M and B,
// the checkpoints it saved since, W and a probe P of 0.5 s a step) and
// saves when the coordinator's rule says so; ranks that lost the
// coordinator after the same decision stop at the same step. A
// ReportCheckpoint that cannot get through is queued and returns no error.
// The rank logs one WARNING when it goes its own way and one when the
// coordinator answers again; it then reports its steps (local_action) and
// checkpoints in order, and logs an ERROR for a step the coordinator had
// decided otherwise. Trainer.Close reports what is left, waiting up to W,
// and logs an ERROR naming what it could not. Before the first answered
// step there is nothing to plan from, and calls fail as they did.
//
// A worker treats a coordinator that no longer knows its run or token
// (its data lost, or restored from a copy older than the run) as one out
// of reach: it logs one WARNING, goes on following and heartbeating at its
// backoff, and resumes if the coordinator knows the run again; its
// Commands stay open. A wrong run or token fails StartWorker, before any
// answer.
//
// # Several coordinators
//
// Dial takes a comma-separated list of addresses ("a:7070,b:7070,c:7070")
// for coordinators that share an etcd prefix, of which one leads. The
// client connects to all of them and sends every call to the one whose
// gRPC health reported WorkerService SERVING last: the leader (followers
// report NOT_SERVING; a coordinator on bbolt reports SERVING). After a
// failover calls go to the new leader as soon as it says it serves, even
// while a frozen ex-leader (SIGSTOP, a long pause) still looks SERVING,
// and a call or stream still out under the previous leader is cut, 1 s
// after the change at most, and made again (resumed) there. A call that
// still meets a follower (UNAVAILABLE with ErrorInfo reason NOT_LEADER,
// see NotLeader) is made again whatever its method: the follower did
// nothing; it is passed over until its health turns SERVING anew. A
// single address is dialed exactly as before.
//
// # Retries
//
// Unary calls that are safe to repeat are retried on UNAVAILABLE with
// jittered exponential backoff (RetryPolicy), and a wait ends as soon as
// the connection has a coordinator to send the call to (after a restart,
// or a leader serving after a failover), so a call goes through within
// milliseconds of that, not a backoff later. A call with a deadline is
// retried until it, however many attempts it takes (an election or a loss
// of etcd quorum may outlast MaxAttempts); MaxAttempts bounds the others.
// Each attempt but a long poll's is bounded by RetryPolicy.AttemptTimeout
// (10 s), so that a call sent to a coordinator that froze is made again.
// Safe to repeat are reads, UpdateDeadline, CancelRun,
// RegisterWorker, Heartbeat, DeregisterWorker, CompleteStep and every
// report, because the coordinator deduplicates them, TriggerDeadline,
// whose repeat with the same reason answers OK with the trigger it made,
// and CreateRun, whose repeat before any worker registered gets a new run
// token (the one in a lost reply stops working). ReissueRunToken is not
// retried on a plain UNAVAILABLE. A coordinator that could not confirm a
// change's commit answers UNAVAILABLE with reason OUTCOME_UNKNOWN
// (OutcomeUnknown): the change may still take effect. The calls safe to
// repeat are repeated, which resolves it; any other fails with it, as does
// a call whose later attempts got no answer that settles it.
// Streams are resumed from their last sequence number instead of re-sent.
// A worker re-opens its command stream (or polls again) with the policy's
// backoff but at most 1 s apart, and at once when the connection comes up
// (the connection itself reconnects at most 0.6 s apart): a worker hears a
// command, and a waiting call or a trainer's next step is answered, within
// a second of a restarted coordinator serving again, however long it was
// down.
package client
