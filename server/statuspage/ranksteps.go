package statuspage

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// RankSteps remembers the last step each trainer rank completed, as seen in
// successful CompleteStep calls. The API keeps only a run's last step (the
// highest any rank reached), yet a rank that stops asking while the others
// go on is what an operator must see before the run fails. It is memory
// only: after a restart, or a change of leader, a rank shows no step until
// it completes its next one (the page says so, and flags a rank that stays
// silent while the run moves on).
type RankSteps struct {
	now func() time.Time

	mu   sync.Mutex
	runs map[string]*runSteps
}

// rankStep is one rank's latest CompleteStep.
type rankStep struct {
	step int64
	at   time.Time
}

type runSteps struct {
	// first is the first step seen for the run since this process started:
	// a rank not seen since may have completed at most that step.
	first   int64
	ranks   map[string]rankStep // by worker_id
	touched time.Time
}

// maxTrackedRuns bounds the memory: beyond it the run stepped least
// recently is forgotten (runs deleted by retention are never told about).
const maxTrackedRuns = 4096

// NewRankSteps returns an empty record; now defaults to time.Now.
func NewRankSteps(now func() time.Time) *RankSteps {
	if now == nil {
		now = time.Now
	}
	return &RankSteps{now: now, runs: map[string]*runSteps{}}
}

// UnaryServerInterceptor records each CompleteStep that succeeded. Put it
// after authentication: a call it refused never reaches here.
func (s *RankSteps) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if r, ok := req.(*v1.CompleteStepRequest); ok && err == nil {
			s.record(r.GetRunId(), r.GetWorkerId(), r.GetStep())
		}
		return resp, err
	}
}

func (s *RankSteps) record(runID, workerID string, step int64) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[runID]
	if r == nil {
		s.evict()
		r = &runSteps{first: step, ranks: map[string]rankStep{}}
		s.runs[runID] = r
	}
	r.touched = now
	r.ranks[workerID] = rankStep{step: step, at: now}
}

// evict forgets the least recently stepped run once the bound is reached.
func (s *RankSteps) evict() {
	if len(s.runs) < maxTrackedRuns {
		return
	}
	var oldest string
	for id, r := range s.runs {
		if oldest == "" || r.touched.Before(s.runs[oldest].touched) {
			oldest = id
		}
	}
	delete(s.runs, oldest)
}

// of returns a copy of what is known of the run; ok is false when no rank
// of it completed a step since this process started.
func (s *RankSteps) of(runID string) (first int64, ranks map[string]rankStep, ok bool) {
	if s == nil {
		return 0, nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[runID]
	if r == nil {
		return 0, nil, false
	}
	ranks = make(map[string]rankStep, len(r.ranks))
	for id, st := range r.ranks {
		ranks[id] = st
	}
	return r.first, ranks, true
}
