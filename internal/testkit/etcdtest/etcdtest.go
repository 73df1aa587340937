// Package etcdtest runs a real etcd cluster of child processes on loopback,
// for the tests and tools that need one: the etcd store backend's tests,
// the HA tests, the HA crash test. Members are Debian's /usr/bin/etcd
// (package etcd-server), each with its data directory under one directory
// and its log in a file there; a member can be killed, paused, resumed and
// restarted on the same ports and data.
//
// Tests use Start (or Shared, one cluster per test binary); programs use
// Launch and Close.
package etcdtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
)

// Binary is the etcd server the members run.
const Binary = "/usr/bin/etcd"

// InstallLine installs Binary (and etcdctl) on Debian; scripts/deps-etcd.sh
// runs it when needed.
const InstallLine = "apt-get update && apt-get install -y etcd-server etcd-client"

// ErrMissing means Binary is not installed.
var ErrMissing = errors.New("etcdtest: " + Binary + " is not installed: run scripts/deps-etcd.sh, or as root: " + InstallLine)

// startAttempts bounds the retries of a cluster whose free ports were taken
// by another process between choosing them and etcd binding them.
const startAttempts = 3

// Check reports whether Binary is installed (ErrMissing if not).
func Check() error {
	if _, err := os.Stat(Binary); err != nil {
		return fmt.Errorf("%w (%v)", ErrMissing, err)
	}
	return nil
}

// Cluster is a running etcd cluster.
type Cluster struct {
	dir     string
	members []*member
	tls     *TLS // nil: plaintext
}

// TLS makes the members' client URLs https and requires client
// certificates signed by CAFile (mutual TLS), for the tests of etcd's TLS
// settings. Peers stay plaintext, on loopback.
type TLS struct {
	CAFile                        string // signed the certificates below
	ServerCertFile, ServerKeyFile string // the members', valid for 127.0.0.1
	ClientCertFile, ClientKeyFile string // what Client and the start-up checks present
}

func (t *TLS) clientConfig() (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	info := transport.TLSInfo{TrustedCAFile: t.CAFile, CertFile: t.ClientCertFile, KeyFile: t.ClientKeyFile}
	return info.ClientConfig()
}

// member is one etcd process; its ports and data survive a restart.
type member struct {
	name, dir, logPath string
	clientURL, peerURL string
	initialCluster     string
	tls                *TLS

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has exited
}

// Launch starts an n-member cluster with its data and logs under dir and
// returns once a linearizable read through every member succeeds, or ctx
// ends. On error nothing is left running.
func Launch(ctx context.Context, dir string, n int) (*Cluster, error) {
	return LaunchTLS(ctx, dir, n, nil)
}

// LaunchTLS is Launch with clients served over mutual TLS (nil: plaintext).
func LaunchTLS(ctx context.Context, dir string, n int, tls *TLS) (*Cluster, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("etcdtest: %d members", n)
	}
	var err error
	for attempt := range startAttempts {
		var c *Cluster
		c, err = launchOnce(ctx, filepath.Join(dir, fmt.Sprintf("cluster%d", attempt)), n, tls)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

func launchOnce(ctx context.Context, dir string, n int, tls *TLS) (*Cluster, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	c := &Cluster{dir: dir, tls: tls}
	var peers []string
	for i := range n {
		m := &member{name: fmt.Sprintf("m%d", i), tls: tls}
		m.dir = filepath.Join(dir, m.name)
		m.logPath = filepath.Join(dir, m.name+".log")
		for _, url := range []*string{&m.clientURL, &m.peerURL} {
			addr, err := coordproc.FreePort()
			if err != nil {
				return nil, fmt.Errorf("etcdtest: %w", err)
			}
			*url = "http://" + addr
		}
		if tls != nil {
			m.clientURL = "https://" + strings.TrimPrefix(m.clientURL, "http://")
		}
		peers = append(peers, m.name+"="+m.peerURL)
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.initialCluster = strings.Join(peers, ",")
		if err := m.start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	for i := range c.members {
		if err := c.await(ctx, i); err != nil {
			err = fmt.Errorf("%w\n%s", err, c.Logs())
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (m *member) start() error {
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("etcdtest: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(Binary,
		"--name", m.name,
		"--data-dir", m.dir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", m.initialCluster,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "etcdtest",
		"--logger", "zap",
	)
	if m.tls != nil {
		cmd.Args = append(cmd.Args, "--client-cert-auth", "--trusted-ca-file", m.tls.CAFile,
			"--cert-file", m.tls.ServerCertFile, "--key-file", m.tls.ServerKeyFile)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// A test binary that dies must not leave members behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", m.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	return nil
}

// await returns once member i answers a linearizable read, which needs a
// leader and a quorum, or fails early if its process exits.
func (c *Cluster) await(ctx context.Context, i int) error {
	m := c.members[i]
	cli, err := newClient([]string{m.clientURL}, m.tls)
	if err != nil {
		return err
	}
	defer cli.Close()
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	for {
		attempt, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Get(attempt, "etcdtest/ready")
		cancel()
		if err == nil {
			return nil
		}
		select { // back off: a refused connection fails at once
		case <-done:
			return fmt.Errorf("etcdtest: member %s exited while starting: %s", m.name, tail(m.log(), 2000))
		case <-ctx.Done():
			return fmt.Errorf("etcdtest: member %s not ready: %w (last error: %v)", m.name, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func newClient(endpoints []string, t *TLS) (*clientv3.Client, error) {
	tlsCfg, err := t.clientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcdtest: client TLS: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         tlsCfg,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcdtest: client: %w", err)
	}
	return cli, nil
}

// Client returns a new client of the whole cluster; the caller closes it.
func (c *Cluster) Client() (*clientv3.Client, error) { return newClient(c.Endpoints(), c.tls) }

// Endpoints are the members' client URLs, in member order.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.clientURL
	}
	return eps
}

// Dir is the directory holding the members' data and logs.
func (c *Cluster) Dir() string { return c.dir }

// Size is the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Pid is member i's process id.
func (c *Cluster) Pid(i int) int {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Pid
}

// Kill SIGKILLs member i and waits for it to exit.
func (c *Cluster) Kill(i int) error {
	m := c.members[i]
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	// A stopped process dies of SIGKILL too.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("etcdtest: kill %s: %w", m.name, err)
	}
	<-done
	return nil
}

// Stop pauses member i with SIGSTOP: it holds its ports but answers
// nothing, as a member on a frozen machine. It returns once the process
// is stopped: the signal is delivered asynchronously, and a member still
// running for a moment could answer a request its caller counts on going
// unanswered.
func (c *Cluster) Stop(i int) error {
	if err := c.signal(i, syscall.SIGSTOP); err != nil {
		return err
	}
	stat := fmt.Sprintf("/proc/%d/stat", c.Pid(i))
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return fmt.Errorf("etcdtest: stop %s: %w", c.members[i].name, err)
		}
		// The state follows the parenthesised command name: "pid (comm) T ...".
		if j := bytes.LastIndexByte(b, ')'); j >= 0 && j+2 < len(b) && b[j+2] == 'T' {
			return nil
		}
	}
	return fmt.Errorf("etcdtest: %s not stopped 5 s after SIGSTOP", c.members[i].name)
}

// Cont resumes member i after Stop.
func (c *Cluster) Cont(i int) error { return c.signal(i, syscall.SIGCONT) }

func (c *Cluster) signal(i int, sig syscall.Signal) error {
	m := c.members[i]
	m.mu.Lock()
	cmd := m.cmd
	m.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("etcdtest: %v %s: %w", sig, m.name, err)
	}
	return nil
}

// Restart kills member i if it still runs, starts it again on its ports
// and data, and returns once it answers a linearizable read.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.Kill(i); err != nil {
		return err
	}
	if err := c.members[i].start(); err != nil {
		return err
	}
	return c.await(ctx, i)
}

// Close kills every member (they are resumed first if stopped) and waits
// for them to exit. Data and logs stay in Dir.
func (c *Cluster) Close() {
	for i, m := range c.members {
		m.mu.Lock()
		started := m.cmd != nil
		m.mu.Unlock()
		if started {
			_ = c.Kill(i)
		}
	}
}

// Logs returns every member's log so far, each under a header.
func (c *Cluster) Logs() string { return c.logs(-1) }

// logs is Logs with each log cut to its last n bytes (n < 0: whole).
func (c *Cluster) logs(n int) string {
	var b strings.Builder
	for _, m := range c.members {
		log := m.log()
		if n >= 0 {
			log = tail(log, n)
		}
		fmt.Fprintf(&b, "==== etcd member %s (%s) ====\n%s\n", m.name, m.clientURL, log)
	}
	return b.String()
}

func (m *member) log() string {
	raw, err := os.ReadFile(m.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(raw)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
