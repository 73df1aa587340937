package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/cmd/internal/durations"
)

// connect dials with the admin token and waits, within --timeout, for the
// connection to come up. A one-shot command fails as soon as the first
// attempt does, saying why and what to change: a refused connection, a
// TLS/plaintext mismatch or an untrusted certificate does not go away in
// the 20 s the client would retry it. Once connected, calls are retried
// as before: a coordinator that goes away then is restarting. The sidecar,
// which must ride out restarts from its start, uses dial.
func (c *cli) connect(ctx context.Context) (*client.Client, error) {
	cl, err := c.dial("")
	if err != nil {
		return nil, err
	}
	if err := c.awaitConnection(ctx, cl.Conn()); err != nil {
		cl.Close()
		return nil, err
	}
	if err := c.awaitLeader(ctx, cl.Conn()); err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// awaitLeader fails at once, naming the leader, when the one address given
// is a follower's: its calls would be refused NOT_LEADER, retried for
// about 20 s, and refused again. Its health tells: RunService NOT_SERVING.
// (A list finds its leader by health checks, or fails to connect.)
func (c *cli) awaitLeader(ctx context.Context, conn *grpc.ClientConn) error {
	addrs := client.Addrs(c.conn.addr)
	if len(addrs) != 1 {
		return nil
	}
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: v1.RunService_ServiceDesc.ServiceName})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		return nil // SERVING, or a coordinator without this health: the calls tell
	}
	return c.followerRefusal(ctx, addrs)
}

// awaitConnection waits until conn is READY, or its first attempt failed.
func (c *cli) awaitConnection(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := c.call(ctx)
	defer cancel()
	conn.Connect()
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure:
			return c.connectFailure(ctx, conn)
		}
		if !conn.WaitForStateChange(ctx, state) {
			if parent := context.Cause(ctx); errors.Is(parent, context.Canceled) {
				return parent
			}
			return withExit(exitUnavailable, fmt.Errorf("cannot connect to %s over %s: no connection within --timeout %s "+
				"(still %s: the host does not answer, or what answers is not a gRPC server)",
				c.conn.addr, c.transportName(), durations.Format(c.conn.timeout), strings.ToLower(state.String())))
		}
	}
}

// connectFailure reads why the connection failed: a call on a connection
// in TRANSIENT_FAILURE fails at once, with the last attempt's error. If it
// is answered after all, the connection came up in between.
func (c *cli) connectFailure(ctx context.Context, conn *grpc.ClientConn) error {
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if st, ok := status.FromError(err); err == nil || !ok || st.Code() != codes.Unavailable {
		return nil
	}
	if addrs := client.Addrs(c.conn.addr); len(addrs) > 1 {
		if refusal := c.followerRefusal(ctx, addrs); refusal != nil {
			return refusal
		}
	}
	cause := connectCause(status.Convert(err).Message())
	return withExit(exitUnavailable, fmt.Errorf("cannot connect to %s over %s: %s. %s", c.conn.addr, c.transportName(), cause, c.connectFix(cause)))
}

// followerRefusal asks each of addrs, where no leader was found, directly
// (one address, no health checking, no retry) and returns the first
// refusal as a follower (NOT_LEADER), which names the leader: addrs lack
// it. Nil if none refused so (then the connection error says why).
func (c *cli) followerRefusal(ctx context.Context, addrs []string) error {
	for _, addr := range addrs {
		cl, err := c.dialAddr(addr, "", client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
		if err != nil {
			return err
		}
		_, err = cl.Runs.ListRuns(ctx, &v1.ListRunsRequest{PageSize: 1})
		cl.Close()
		leader, ok := client.NotLeader(err)
		if !ok {
			continue
		}
		fix := "No coordinator leads at the moment: an election is under way, or the coordinators cannot reach etcd"
		if leader != "" {
			fix = fmt.Sprintf("Add %s to --addr (or SNAPCOORD_ADDR)", leader)
		}
		return withExit(exitUnavailable, fmt.Errorf("no leader at %s: %s answers %q. %s",
			c.conn.addr, addr, status.Convert(err).Message(), fix))
	}
	return nil
}

// attemptLog keeps the error of the last attempt of a call that failed
// UNAVAILABLE. When the client's retries run into --timeout, grpc-go
// reports only "context deadline exceeded", not what the attempts met.
type attemptLog struct {
	mu   sync.Mutex
	last error
}

// record is a unary interceptor inside the client's retries: it sees every
// attempt.
func (l *attemptLog) record(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if status.Code(err) == codes.Unavailable {
		l.mu.Lock()
		l.last = err
		l.mu.Unlock()
	}
	return err
}

func (l *attemptLog) lastError() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// transportName says how snapctl talked, and why when it chose itself.
func (c *cli) transportName() string {
	switch {
	case c.conn.plainByDefault:
		return "plaintext (the default for a loopback address)"
	case c.conn.plainInUse:
		return "plaintext"
	}
	return "TLS"
}

// grpcCause is the error inside grpc-go's "connection error: desc =
// \"transport: ...\"".
var grpcCause = regexp.MustCompile(`desc = "(?:transport: )?(?:Error while dialing:? )?(.*)"$`)

func connectCause(msg string) string {
	if m := grpcCause.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return msg
}

// connectFixes map what a failed first connection says to what to change,
// first match wins. They are matched in grpc-go's and crypto/tls's words:
// the cause reaches snapctl only as the status message.
var connectFixes = []struct {
	says []string
	fix  func(c *cli) string
}{
	{[]string{"connection refused"}, func(c *cli) string {
		return "Is the coordinator running, and on this address? (`make run` starts one on 127.0.0.1:7070; --addr or SNAPCOORD_ADDR names another)"
	}},
	{[]string{"first record does not look like a TLS handshake"}, func(c *cli) string {
		return "The coordinator speaks plaintext: pass --plaintext (or SNAPCOORD_PLAINTEXT=1), or give the coordinator --tls-cert and --tls-key"
	}},
	{[]string{"server preface", "connection reset by peer", "EOF"}, func(c *cli) string {
		switch {
		case !c.conn.plainInUse:
			return "Is it a snapcoord coordinator, and does it expect a client certificate (--cert-file, --key-file)?"
		case c.conn.plainByDefault:
			return "The coordinator closed the plaintext connection, as one with TLS does: give --ca-file with the CA that signed its certificate (or --plaintext=false for the system's CAs)"
		}
		return "The coordinator closed the plaintext connection, as one with TLS does: drop --plaintext (and SNAPCOORD_PLAINTEXT) and give --ca-file with the CA that signed its certificate"
	}},
	{[]string{"certificate is valid for", "certificate is not valid for"}, func(c *cli) string {
		return "The coordinator's certificate names another host: connect by a name it holds, or give that name with --server-name"
	}},
	{[]string{"x509:", "failed to verify certificate"}, func(c *cli) string {
		if c.conn.caFile != "" {
			return fmt.Sprintf("The coordinator's certificate is not signed by the CA in --ca-file %s: give the CA that signed it", c.conn.caFile)
		}
		return "The coordinator's certificate is not signed by a CA this host trusts: give --ca-file with the CA that signed it (SNAPCOORD_CA_FILE)"
	}},
	{[]string{"certificate required", "bad certificate", "unknown certificate authority"}, func(c *cli) string {
		return "The coordinator refused snapctl's client certificate (or its absence): give --cert-file and --key-file signed by the coordinator's --client-ca"
	}},
	{[]string{"no such host", "server misbehaving"}, func(c *cli) string {
		return "The host name does not resolve: check --addr (or SNAPCOORD_ADDR)"
	}},
}

func (c *cli) connectFix(cause string) string {
	for _, f := range connectFixes {
		for _, s := range f.says {
			if strings.Contains(cause, s) {
				return f.fix(c)
			}
		}
	}
	return "Check --addr, and that the coordinator's TLS settings match snapctl's (see 'snapctl help')"
}
