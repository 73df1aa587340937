package main

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// conn is one client connection, as one worker process has. The floor and
// the coordinator are driven through the same conn type, stubs and
// metadata, so their figures differ by the server only.
type conn struct {
	cc      *grpc.ClientConn
	runs    v1.RunServiceClient
	workers v1.WorkerServiceClient
}

func dial(addr string) (*conn, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &conn{cc: cc, runs: v1.NewRunServiceClient(cc), workers: v1.NewWorkerServiceClient(cc)}, nil
}

func (c *conn) close() { _ = c.cc.Close() }

// withToken carries the run token as WorkerService requires. Built once
// per worker, so a call pays no allocation for it.
func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// forEach calls fn for 0..n-1 from up to par goroutines and returns the
// first error.
func forEach(ctx context.Context, n, par int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(par, n) {
		wg.Go(func() {
			for i := range next {
				if ctx.Err() != nil {
					continue
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}

// worker is one registered worker with its own connection.
type worker struct {
	c     *conn
	ctx   context.Context // carries the run token
	runID string
	id    string
	// lastSeq is the command log position at registration.
	lastSeq int64
}

// registerWorkers dials n connections and registers one worker on each.
func registerWorkers(ctx context.Context, addr, runID, token string, role v1.WorkerRole, n int, name func(i int) string) ([]*worker, error) {
	ws := make([]*worker, n)
	err := forEach(ctx, n, 64, func(ctx context.Context, i int) error {
		rank := int32(0)
		if role == v1.WorkerRole_WORKER_ROLE_TRAINER {
			rank = int32(i)
		}
		w, err := registerWorker(ctx, addr, runID, token, role, name(i), rank)
		ws[i] = w
		return err
	})
	if err != nil {
		closeWorkers(ws)
		return nil, err
	}
	return ws, nil
}

// registerWorker dials a connection of its own and registers one worker.
func registerWorker(ctx context.Context, addr, runID, token string, role v1.WorkerRole, name string, rank int32) (*worker, error) {
	c, err := dial(addr)
	if err != nil {
		return nil, err
	}
	w, err := registerOn(ctx, c, runID, token, role, name, rank)
	if err != nil {
		c.close()
		return nil, err
	}
	return w, nil
}

// registerOn registers one worker on an existing connection.
func registerOn(ctx context.Context, c *conn, runID, token string, role v1.WorkerRole, name string, rank int32) (*worker, error) {
	resp, err := c.workers.RegisterWorker(withToken(ctx, token), &v1.RegisterWorkerRequest{
		RunId: runID, Role: role, Name: name, Rank: rank,
	})
	if err != nil {
		return nil, fmt.Errorf("register %s in %s: %w", name, runID, err)
	}
	return &worker{c: c, ctx: withToken(context.Background(), token), runID: runID, id: resp.WorkerId, lastSeq: resp.LastCommandSeq}, nil
}

// sharedConns hands out connections to workers, per of them on each (the
// workers of one host multiplexed by a sidecar); per 1 is a connection per
// worker, as separate processes have.
type sharedConns struct {
	addr  string
	per   int
	mu    sync.Mutex
	conns map[int]*conn
}

func (s *sharedConns) get(i int) (*conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := i / max(s.per, 1)
	if c := s.conns[k]; c != nil {
		return c, nil
	}
	c, err := dial(s.addr)
	if err != nil {
		return nil, err
	}
	if s.conns == nil {
		s.conns = map[int]*conn{}
	}
	s.conns[k] = c
	return c, nil
}

func (s *sharedConns) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.close()
	}
}

func closeWorkers(ws []*worker) {
	for _, w := range ws {
		if w != nil {
			w.c.close()
		}
	}
}
