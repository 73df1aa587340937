package coordinator

import (
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/snapcoord/snapcoord/internal/loopback"
)

// Config is every setting of a coordinator. `snapcoord serve` binds its
// flags to these fields, starting from Defaults; tests start from Defaults
// too and change what they need, so they run what production runs.
type Config struct {
	// Listen is the gRPC address; port 0 picks a free one (see Addr).
	Listen string
	// Store is where state is kept: StoreBbolt, a file in DataDir, or
	// StoreEtcd, an etcd cluster shared by coordinators that elect a
	// leader among themselves.
	Store StoreKind
	// DataDir holds the store file snapcoord.db (created 0700 if missing).
	DataDir string
	// Etcd is the cluster of StoreEtcd.
	Etcd EtcdConfig
	// AdvertiseAddr is the address clients reach this coordinator at, told
	// to them by the other coordinators while this one leads; empty: the
	// listening address (which must then not be a wildcard).
	AdvertiseAddr string
	// AdvertiseHTTP is the URL (or host:port) of this coordinator's status
	// page as people reach it, to which the others' pages send them while
	// this one leads; empty: http:// and the metrics listener's address,
	// unless that is a wildcard (then the others' pages name none).
	AdvertiseHTTP string
	// ElectionTTL is the lease of this coordinator's election session: a
	// leader that stops renewing it is deposed this long after. Whole
	// seconds (etcd leases count in seconds).
	ElectionTTL time.Duration
	// LockTimeout bounds the wait for another process to release DataDir.
	LockTimeout time.Duration
	// DrainTimeout bounds how long in-flight RPCs may take to finish in Run.
	DrainTimeout time.Duration

	HeartbeatInterval time.Duration // how often workers are told to heartbeat
	LeaseTTL          time.Duration // a worker silent this long is LOST
	// FinishedRunRetention deletes a finished run this long after it
	// ended; 0 keeps finished runs.
	FinishedRunRetention time.Duration
	MaxRuns              int
	MaxWorkersPerRun     int
	MaxEventsPerRun      int

	// RunMetricsRetention keeps an ended run's snapcoord_run_* series this
	// long after it ended (0: they go when it ends). The default, 15
	// minutes, lets a few scrapes and the alerts see how a run ended while
	// ended runs' series stay few.
	RunMetricsRetention time.Duration

	// Security. AdminTokenFile is re-read on change; AdminTokens are added
	// to its tokens and never change (SNAPCOORD_ADMIN_TOKEN). With no admin
	// token at all, RunService is open.
	AdminTokenFile string
	AdminTokens    []string
	TLSCert        string
	TLSKey         string
	ClientCA       string // requires client certificates (mutual TLS)
	Reflection     Reflection
	// ViewerTokenFile holds viewer tokens, re-read on change like
	// AdminTokenFile: they open the status page (HTTP basic auth) and
	// nothing on the gRPC API.
	ViewerTokenFile string
	// Insecure accepts an open status page on a non-loopback MetricsListen.
	Insecure bool
	// CredentialsCheckInterval is how often the token and TLS files are
	// checked for changes (0: only when ReloadSignals delivers).
	CredentialsCheckInterval time.Duration
	// ReloadSignals, when not nil, reloads every credential file at each
	// value (SIGHUP for `snapcoord serve`).
	ReloadSignals <-chan os.Signal

	// MetricsListen serves /metrics, the status page and, with Pprof,
	// /debug/pprof/; empty turns it off.
	MetricsListen string
	Pprof         bool

	// Transport limits (see grpcserver.Config).
	MaxRecvMsgSize           int
	MaxHeaderListSize        uint32
	MaxConcurrentStreams     uint32
	KeepaliveMinTime         time.Duration
	PermitPingsWithoutStream bool
	KeepaliveTime            time.Duration
	KeepaliveTimeout         time.Duration
	MaxConnectionIdle        time.Duration // 0: never

	// Logger receives the coordinator's log; nil discards it.
	Logger *slog.Logger
	// LogCalls says which successful routine calls (the fleet's steps,
	// reports, heartbeats and polls) are logged at info: LogCallsSlow,
	// those slower than SlowCall, or LogCallsAll. Other calls and failures
	// always are.
	LogCalls LogCalls
	SlowCall time.Duration
	// LookupEnv reads the OTEL_* variables; nil reads none (no export).
	LookupEnv func(string) (string, bool)
	// ServiceVersion is reported to OpenTelemetry.
	ServiceVersion string
}

// LogCalls is Config.LogCalls.
type LogCalls string

// Values of Config.LogCalls.
const (
	LogCallsSlow LogCalls = "slow"
	LogCallsAll  LogCalls = "all"
)

// StoreKind names a store backend.
type StoreKind string

// Values of Config.Store.
const (
	StoreBbolt StoreKind = "bbolt"
	StoreEtcd  StoreKind = "etcd"
)

// EtcdConfig is how to reach etcd. With CAFile the connection is TLS; with
// CertFile and KeyFile as well, mutual TLS.
type EtcdConfig struct {
	Endpoints []string // host:port of the members
	// Prefix is the key prefix of this coordinator group's state and
	// election (<Prefix>/leader).
	Prefix   string
	CAFile   string
	CertFile string
	KeyFile  string
}

// Reflection says who may use server reflection.
type Reflection string

// Values of Config.Reflection.
const (
	ReflectionAuto Reflection = "auto" // open on a loopback Listen, admin elsewhere
	ReflectionOpen Reflection = "open"
	ReflectionAuth Reflection = "auth"
	ReflectionOff  Reflection = "off"
)

// Defaults is the coordinator's configuration unless told otherwise: the
// one place the serve defaults are written down.
func Defaults() Config {
	return Config{
		Listen:  "127.0.0.1:7070",
		Store:   StoreBbolt,
		DataDir: "./data",
		Etcd:    EtcdConfig{Prefix: "/snapcoord"},
		// A dead leader is replaced within about this long; a shorter
		// lease would depose a leader for a pause of the garbage collector
		// or a slow etcd member.
		ElectionTTL:         5 * time.Second,
		LockTimeout:         time.Second,
		DrainTimeout:        10 * time.Second,
		HeartbeatInterval:   5 * time.Second,
		LeaseTTL:            15 * time.Second,
		MaxRuns:             10000,
		MaxWorkersPerRun:    10000,
		MaxEventsPerRun:     100000,
		RunMetricsRetention: 15 * time.Minute,
		Reflection:          ReflectionAuto,
		LogCalls:            LogCallsSlow,
		// A step or report answered in over a second is worth a line: the
		// store or the machine is struggling.
		SlowCall:                 time.Second,
		CredentialsCheckInterval: 10 * time.Second,
		MetricsListen:            "127.0.0.1:7071",
		// The largest legitimate request (a CreateRun) is a few hundred bytes.
		MaxRecvMsgSize: 1 << 20,
		// A call carries a token and trace headers. grpc-go's own default,
		// 16 MiB, let a client with no token hold 16 MiB of decoded
		// metadata per call by never sending the request: no interceptor,
		// auth included, runs before the message arrives.
		MaxHeaderListSize: 32 << 10,
		// One sidecar holds one stream, so this is generous.
		MaxConcurrentStreams: 1024,
		KeepaliveMinTime:     10 * time.Second,
		// Idle workers between polls ping legitimately.
		PermitPingsWithoutStream: true,
		KeepaliveTime:            30 * time.Second,
		KeepaliveTimeout:         10 * time.Second,
	}
}

// ReflectionAccess resolves Reflection: whether to serve reflection and
// whether anyone may use it.
func (c Config) ReflectionAccess() (serve, open bool) {
	switch c.Reflection {
	case ReflectionOff:
		return false, false
	case ReflectionAuth:
		return true, false
	case ReflectionOpen:
		return true, true
	default:
		return true, loopback.Is(c.Listen)
	}
}

// StatusPageAllowed applies RunService's exposure rule to the status page:
// with no admin or viewer token (tokens counts both) it is open, so it is
// served only on a loopback MetricsListen, unless Insecure says an open
// page is meant. (/metrics itself stays open, as Prometheus scrapes it.)
func (c Config) StatusPageAllowed(tokens int) bool {
	return tokens > 0 || c.Insecure || loopback.Is(c.MetricsListen)
}

// Reachable reports whether a listening address is one a client can dial:
// it names a host, and not a wildcard (":7070", "0.0.0.0:7070", "[::]:7070").
func Reachable(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil || host == "" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsUnspecified()
}

// advertisePage is the status page's URL other coordinators send people
// to while this one leads (metricsAddr: the metrics listener's, port
// resolved; "" when off); "" when there is none to give.
func (c Config) advertisePage(metricsAddr string) string {
	switch {
	case c.AdvertiseHTTP != "" && strings.Contains(c.AdvertiseHTTP, "://"):
		return strings.TrimSuffix(c.AdvertiseHTTP, "/")
	case c.AdvertiseHTTP != "":
		return "http://" + c.AdvertiseHTTP
	case metricsAddr != "" && Reachable(c.MetricsListen):
		return "http://" + metricsAddr
	}
	return ""
}

// advertise is the address other coordinators name as this one's while it
// leads: AdvertiseAddr, or the address it listens on (addr, port resolved).
func (c Config) advertise(addr string) string {
	if c.AdvertiseAddr != "" {
		return c.AdvertiseAddr
	}
	return addr
}
