package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/cmd/internal/durations"
)

// defaultConnectTimeout is how long a new connection may go unanswered. A
// coordinator answers the handshakes and a health check in milliseconds,
// even across a continent; a peer that has not in 1.5 s is not going to,
// and an operator should not wait --timeout (30 s) to hear so: the command
// ends within 2 s, its start and the message included.
const defaultConnectTimeout = 1500 * time.Millisecond

// errNoAnswer is the cause of connectBound's context when its bound passed.
var errNoAnswer = errors.New("no answer within the connect bound")

// connectBound bounds the wait for a new connection to be answered:
// --connect-timeout, or --timeout if that is shorter (or the only one set).
func (c *cli) connectBound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, c.connectWait(), errNoAnswer)
}

// connectWait is connectBound's bound, and connectBoundName names its flag.
func (c *cli) connectWait() time.Duration {
	if c.conn.connectTimeout <= 0 || c.conn.timeout < c.conn.connectTimeout {
		return c.conn.timeout
	}
	return c.conn.connectTimeout
}

func (c *cli) connectBoundName() string {
	name := "--connect-timeout"
	if c.connectWait() != c.conn.connectTimeout {
		name = "--timeout"
	}
	return name + " " + durations.Format(c.connectWait())
}

// noAnswer is the error for a peer that left the connection unanswered
// until the connect bound: what it did answer (what, and the probe's finding),
// and what to look at. It gives no TLS advice: a TLS mismatch fails at
// once (a handshake refused or garbled), it does not go silent.
func (c *cli) noAnswer(what string, probe *probeResult) error {
	msg := fmt.Sprintf("cannot connect to %s over %s: ", c.conn.addr, c.transportName())
	switch {
	case probe != nil && len(probe.accepted) == 0:
		msg += fmt.Sprintf("no TCP connection within %s: the host does not answer (down, or a firewall drops the packets). Check --addr (or SNAPCOORD_ADDR)",
			c.connectBoundName())
	case probe != nil:
		msg += fmt.Sprintf("%s the connection but did not answer within %s. Something holds the port without serving it: "+
			"a coordinator that is stopped or hung, or another program that waits for its client to speak first. "+
			"Check --addr (or SNAPCOORD_ADDR), and the coordinator's process and log", c.whoAccepted(probe.accepted), c.connectBoundName())
	default:
		msg += fmt.Sprintf("it %s within %s: a coordinator that is hung or overloaded, or a server that is not snapcoord's. "+
			"Check --addr (or SNAPCOORD_ADDR), and the coordinator's process and log", what, c.connectBoundName())
	}
	flagName, _, _ := strings.Cut(c.connectBoundName(), " ")
	return withExit(exitUnavailable, fmt.Errorf("%s (a coordinator on a slow link may need a longer %s)", msg, flagName))
}

// whoAccepted: "it accepted" for --addr's one address, "a:1, b:2
// accepted" for those of a list that did.
func (c *cli) whoAccepted(addrs []string) string {
	if len(client.Addrs(c.conn.addr)) == 1 {
		return "it accepted"
	}
	return strings.Join(addrs, ", ") + " accepted"
}

// tcpProbe finds, for a connection that is slow to come up, whether its
// addresses accept TCP connections at all: "accepted but silent" and "no
// answer" call for different fixes, and grpc-go does not say which it
// met. It runs only once half the bound has passed, so a coordinator that
// answers never sees it.
type tcpProbe struct {
	cancel context.CancelFunc
	done   chan struct{}
	res    *probeResult // set before done is closed; nil if it never ran
}

// probeResult lists the addresses that accepted a TCP connection.
type probeResult struct{ accepted []string }

func (c *cli) probeLater(ctx context.Context) *tcpProbe {
	ctx, cancel := context.WithCancel(ctx)
	p := &tcpProbe{cancel: cancel, done: make(chan struct{})}
	delay := c.connectWait() / 2
	if deadline, ok := ctx.Deadline(); ok {
		delay = time.Until(deadline) / 2
	}
	go func() {
		defer close(p.done)
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.res = &probeResult{accepted: accepting(ctx, client.Addrs(c.conn.addr))}
	}()
	return p
}

// result waits for the probe, whose context has ended with the bound's.
func (p *tcpProbe) result() *probeResult {
	<-p.done
	return p.res
}

func (p *tcpProbe) stop() {
	p.cancel()
	<-p.done
}

// accepting dials each address (TCP only, closed at once) and returns
// those that accepted before ctx ended, in order.
func accepting(ctx context.Context, addrs []string) []string {
	ok := make([]bool, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			var d net.Dialer
			if conn, err := d.DialContext(ctx, "tcp", a); err == nil {
				conn.Close()
				ok[i] = true
			}
		})
	}
	wg.Wait()
	var out []string
	for i, a := range addrs {
		if ok[i] {
			out = append(out, a)
		}
	}
	return out
}

// warnIfUnanswered waits, within the connect bound, for conn to come up,
// and logs why it did not. The sidecar rides out a coordinator that is
// down or restarting (its registration is retried until --timeout), but
// says within seconds, not at --timeout, what it is waiting for: a
// refused connection, a TLS mismatch, or a peer that never answers.
func (c *cli) warnIfUnanswered(ctx context.Context, conn *grpc.ClientConn, log *slog.Logger) {
	bounded, cancel := c.connectBound(ctx)
	defer cancel()
	if err := c.awaitConnection(bounded, conn); err != nil && ctx.Err() == nil {
		log.Warn("the coordinator does not answer; still trying until --timeout "+durations.Format(c.conn.timeout), "err", err)
	}
}
