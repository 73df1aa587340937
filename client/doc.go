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
// # Several coordinators
//
// Dial takes a comma-separated list of addresses ("a:7070,b:7070,c:7070")
// for coordinators that share an etcd prefix, of which one leads. The
// client connects to all of them and sends every call to the one whose
// gRPC health reports WorkerService SERVING: the leader (followers report
// NOT_SERVING; a coordinator on bbolt reports SERVING). After a failover
// calls go to the new leader as soon as it says it serves. A call that
// still meets a follower (UNAVAILABLE with ErrorInfo reason NOT_LEADER,
// see NotLeader) is made again whatever its method: the follower did
// nothing. A single address is dialed exactly as before.
//
// # Retries
//
// Unary calls that are safe to repeat are retried on UNAVAILABLE with
// jittered exponential backoff (RetryPolicy), and a wait ends as soon as
// the connection has a coordinator to send the call to (after a restart,
// or a leader serving after a failover), so a call goes through within
// milliseconds of that, not a backoff later. Safe to repeat are reads, UpdateDeadline, CancelRun,
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
// (the connection itself reconnects at most 1 s apart): a worker hears a
// command within about a second of a restarted coordinator coming back,
// however long it was down.
package client
