package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/cmd/internal/durations"
)

// connect dials with the admin token and waits, within --connect-timeout
// (and --timeout), for the coordinator to answer: the connection comes up
// and, for one address, a health check is answered. A one-shot command
// fails as soon as the first attempt does, saying why and what to change: a
// refused connection, a TLS/plaintext mismatch or an untrusted certificate
// does not go away in the 20 s the client would retry it; nor, within
// --timeout, does a peer that accepts connections and never answers. Once
// connected, calls are retried as before: a coordinator that goes away then
// is restarting. Streams that follow (events --follow, run watch) are not
// bounded past this. The sidecar, which must ride out restarts from its
// start, uses dial.
func (c *cli) connect(ctx context.Context) (*client.Client, error) {
	cl, err := c.dial("")
	if err != nil {
		return nil, err
	}
	bounded, cancel := c.connectBound(ctx)
	defer cancel()
	err = c.awaitConnection(bounded, cl.Conn())
	if e, ok := errors.AsType[electing](err); ok {
		err = c.awaitElection(ctx, cl.Conn(), e.refusal)
	}
	if err == nil {
		err = c.awaitLeader(bounded, cl.Conn())
	}
	if err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// electing: every coordinator of the list that answers is a follower, and
// none names a leader outside the list: a leader is being elected among
// them (or they cannot reach etcd). refusal is a follower's answer.
type electing struct{ refusal error }

func (e electing) Error() string { return e.refusal.Error() }
func (e electing) Unwrap() error { return e.refusal }

// awaitElection waits, within --timeout, for a coordinator of the list to
// lead, saying on stderr that it does: an election takes up to the
// coordinators' --election-ttl (5 s by default), within the default
// --timeout (30 s), and an operator's command given during one should
// wait for it rather than fail. refusal is a follower's answer, which the
// error quotes if none leads in time.
func (c *cli) awaitElection(ctx context.Context, conn *grpc.ClientConn, refusal error) error {
	if !c.jsonErrors {
		fmt.Fprintf(c.stderr, "snapctl: electing a leader among %s: waiting up to --timeout %s\n", c.conn.addr, durations.Format(c.conn.timeout))
	}
	ctx, cancel := c.call(ctx)
	defer cancel()
	for state := conn.GetState(); state != connectivity.Ready; state = conn.GetState() {
		if state == connectivity.Idle {
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, state) {
			if parent := context.Cause(ctx); errors.Is(parent, context.Canceled) {
				return parent
			}
			return withExit(exitUnavailable, fmt.Errorf("%w; still none after --timeout %s: the coordinators cannot reach etcd (is a majority of its members up?), or the election outlasts --timeout",
				refusal, durations.Format(c.conn.timeout)))
		}
	}
	return nil
}

// awaitLeader fails at once, naming the leader, when the one address given
// is a follower's: its calls would be refused NOT_LEADER, retried for
// about 20 s, and refused again. Its health tells: RunService NOT_SERVING.
// (A list finds its leader by health checks, or fails to connect.) The
// check is also the first answer asked of the peer: one that made the
// HTTP/2 handshake and then leaves calls unanswered fails here, within
// ctx's bound, rather than later, at --timeout or never (a follow).
func (c *cli) awaitLeader(ctx context.Context, conn *grpc.ClientConn) error {
	addrs := client.Addrs(c.conn.addr)
	if len(addrs) != 1 {
		return nil
	}
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: v1.RunService_ServiceDesc.ServiceName})
	if status.Code(err) == codes.DeadlineExceeded {
		// The coordinator's side of the deadline (grpc-timeout) may end
		// the call a moment before ctx's own timer fires.
		<-ctx.Done()
		if errors.Is(context.Cause(ctx), errNoAnswer) {
			return c.noAnswer("answered the connection but not a health check", nil)
		}
	}
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		return nil // SERVING, or a coordinator without this health: the calls tell
	}
	_, refusal := c.followerRefusal(ctx, addrs)
	return refusal
}

// awaitConnection waits until conn is READY (the peer answered the
// handshakes), or its first attempt failed, or ctx's bound passed.
func (c *cli) awaitConnection(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	probe := c.probeLater(ctx)
	defer probe.stop()
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
			res := probe.result()
			if e, ok := c.silentLeader(ctx, res); ok {
				return e
			}
			return c.noAnswer("did not answer", res)
		}
	}
}

// electingAmong asks each of several addresses whether it is a follower
// that knows no leader outside the list: then a leader is being elected.
func (c *cli) electingAmong(ctx context.Context) (electing, bool) {
	addrs := client.Addrs(c.conn.addr)
	if len(addrs) < 2 {
		return electing{}, false
	}
	leader, refusal := c.followerRefusal(ctx, addrs)
	if refusal == nil || leader != "" && !slices.Contains(addrs, leader) {
		return electing{}, false
	}
	return electing{refusal}, true
}

// silentLeader: once the connect bound passed with no leader found, and
// several of the addresses accepted a TCP connection (probe), one of which
// stays silent (a leader frozen: SIGSTOP, a long pause), the others may be
// followers waiting to elect the next: asked at once, each, for a second,
// the first follower's refusal means an election.
func (c *cli) silentLeader(ctx context.Context, probe *probeResult) (electing, bool) {
	if probe == nil || len(probe.accepted) < 2 {
		return electing{}, false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	found := make(chan electing, len(probe.accepted))
	var wg sync.WaitGroup
	for _, addr := range probe.accepted {
		wg.Go(func() {
			if leader, refusal := c.followerRefusal(ctx, []string{addr}); refusal != nil &&
				(leader == "" || slices.Contains(client.Addrs(c.conn.addr), leader)) {
				found <- electing{refusal}
			}
		})
	}
	go func() { wg.Wait(); close(found) }()
	e, ok := <-found
	return e, ok
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
		if e, ok := c.electingAmong(ctx); ok {
			return e
		}
		if _, refusal := c.followerRefusal(ctx, addrs); refusal != nil {
			return refusal
		}
	}
	cause := connectCause(status.Convert(err).Message())
	return withExit(exitUnavailable, fmt.Errorf("cannot connect to %s over %s: %s. %s", c.conn.addr, c.transportName(), cause, c.connectFix(cause)))
}

// followerRefusal asks each of addrs, where no leader was found, directly
// (one address, no health checking, no retry) and returns the first
// refusal as a follower (NOT_LEADER) with the leader it names ("" if none).
// Nil if none refused so (then the connection error says why).
func (c *cli) followerRefusal(ctx context.Context, addrs []string) (leader string, refusal error) {
	for _, addr := range addrs {
		cl, err := c.dialAddr(addr, "", client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
		if err != nil {
			return "", err
		}
		_, err = cl.Runs.ListRuns(ctx, &v1.ListRunsRequest{PageSize: 1})
		cl.Close()
		named, ok := client.NotLeader(err)
		if !ok {
			continue
		}
		fix := "No coordinator leads at the moment: an election is under way, or the coordinators cannot reach etcd"
		if named != "" && !slices.Contains(addrs, named) {
			fix = fmt.Sprintf("Add %s to --addr (or SNAPCOORD_ADDR)", named)
		}
		return named, withExit(exitUnavailable, fmt.Errorf("no leader at %s: %s answers %q. %s",
			c.conn.addr, addr, status.Convert(err).Message(), fix))
	}
	return "", nil
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
	// grpc-go closes a connection whose handshake is not answered within
	// its own connect timeout (5 s): a silent peer, when --connect-timeout
	// is longer. It reads as a closed connection, which is not TLS's doing.
	{[]string{"use of closed network connection"}, func(c *cli) string {
		return "It accepted the connection but did not answer: something holds the port without serving it (a coordinator that is stopped or hung, or another program). Check --addr (or SNAPCOORD_ADDR), and the coordinator's process and log"
	}},
	{[]string{"looked like an HTTP/1.1 header"}, func(c *cli) string {
		return "What answers there speaks HTTP/1.1, not gRPC: a web server, such as the coordinator's --metrics-listen (its /metrics and status page, 127.0.0.1:7071 under `make run`). Give --addr the coordinator's gRPC --listen address (127.0.0.1:7070 under `make run`)"
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
