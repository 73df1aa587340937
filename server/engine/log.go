package engine

import (
	"context"
	"sort"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// event appends a run event.
func (m logMut) event(ev *v1.RunEvent) {
	run := m.r.rec.Run
	run.LastEventSeq++
	ev.Seq = run.LastEventSeq
	ev.At = m.ts()
	m.r.events = append(m.r.events, ev)
	m.b.PutEvent(m.r.id, ev)
	m.dirty()
	m.notify.events = true
}

// command appends to the command log, and records that it did.
func (m logMut) command(audience v1.WorkerRole, c *v1.Command) *v1.Command {
	m.r.rec.LastCommandSeq++
	c.Seq = m.r.rec.LastCommandSeq
	c.IssuedAt = m.ts()
	c.Audience = audience
	m.r.commands = append(m.r.commands, c)
	m.b.PutCommand(m.r.id, c)
	m.notify.commands = true
	kind := commandKind(c)
	m.event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_COMMAND_ISSUED, CommandSeq: c.Seq,
		Message: "command " + kind + " issued to " + audienceName(audience)})
	m.observe(func(ctx context.Context) { m.e.obs.CommandIssued(ctx, kind) })
	return c
}

// eventsKept is how many of a run's latest events stay in memory, for
// watchers following the run; older ones, up to --max-events-per-run, are
// read from the store by a watcher that asks for them. With a decision event
// per step, a long run would otherwise hold 100,000 of them (about 90 MB).
const eventsKept = 256

// trimEvents deletes the events beyond --max-events-per-run from the store,
// and drops the ones older than the latest eventsKept from memory once
// twice that many are held.
func (m logMut) trimEvents() {
	r := m.r
	through := r.rec.Run.LastEventSeq - int64(m.e.opts.MaxEventsPerRun)
	if through > r.eventsDeletedThrough {
		m.b.DeleteEventsThrough(r.id, through)
		r.eventsDeletedThrough = through
	}
	n := len(r.events)
	if n == 0 || (n <= 2*eventsKept && r.events[0].Seq > through) {
		return
	}
	from := max(through, r.rec.Run.LastEventSeq-eventsKept)
	i := sort.Search(n, func(i int) bool { return r.events[i].Seq > from })
	r.events = append([]*v1.RunEvent(nil), r.events[i:]...)
}

func commandKind(c *v1.Command) string {
	switch c.Kind.(type) {
	case *v1.Command_SaveAtDeadline:
		return "save_at_deadline"
	case *v1.Command_Snapshot:
		return "snapshot"
	case *v1.Command_PublishCheckpoint:
		return "publish_checkpoint"
	case *v1.Command_Stop:
		return "stop"
	}
	return "unknown"
}

func audienceName(r v1.WorkerRole) string {
	switch r {
	case v1.WorkerRole_WORKER_ROLE_TRAINER:
		return "trainers"
	case v1.WorkerRole_WORKER_ROLE_ENVIRONMENT:
		return "environment workers"
	}
	return "all workers"
}
