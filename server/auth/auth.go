// Package auth decides who may call what on snapcoord's gRPC server.
//
// Two kinds of bearer credential travel as "authorization: Bearer <token>"
// metadata. Admin tokens, configured by the operator, open RunService. A run
// token, issued once by CreateRun and stored by the engine only as a SHA-256
// digest, opens WorkerService for that one run: every request's run_id must
// be the token's run. Health is always open; reflection is open or needs an
// admin token, as configured.
//
// A third kind, viewer tokens, opens nothing on the gRPC API: only the
// read-only status page on the metrics listener (CheckViewer), so that a
// browser can be given a credential that cannot change a run.
//
// Authentication is one go-grpc-middleware auth interceptor behind a
// selector that matches full method names from a table. The API's methods
// get the credential their proto declares (the rpc option's credential,
// read through package internal/apifacts); a method that declares none, or one the
// table does not know, gets the admin rule: nothing is open by accident.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// Access is what a method asks of its caller.
type Access int

const (
	// Admin methods need an admin token (or nothing, when none is
	// configured). It is the rule for any method the table does not know.
	Admin Access = iota
	// Open methods need nothing.
	Open
	// RunToken methods need the token of the run named in the request.
	RunToken
)

func (a Access) String() string {
	switch a {
	case Open:
		return "open"
	case RunToken:
		return "run token"
	default:
		return "admin"
	}
}

// reflectionV1Alpha is the older reflection service grpc-go's
// reflection.Register also serves (grpcurl still tries it first). Named by
// string: its generated package is deprecated.
const reflectionV1Alpha = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"

// RunResolver finds the run a run token belongs to. *engine.Engine is one.
type RunResolver interface {
	RunForToken(token string) (runID string, ok bool)
}

// Options configure an Authenticator.
type Options struct {
	// AdminTokens open RunService; several may be valid at once so that a
	// token can be rotated without downtime. None: RunService is open.
	AdminTokens []string
	// Runs resolves run tokens. Required.
	Runs RunResolver
	// OpenReflection lets anyone use server reflection; otherwise it is an
	// admin method.
	OpenReflection bool
	// ViewerTokens open the status page only (CheckViewer); the gRPC API
	// refuses them.
	ViewerTokens []string
}

// Authenticator holds the method table and the admin token digests.
type Authenticator struct {
	methods map[string]Access
	// admin is swapped whole by SetAdminTokens, so a reload never shows a
	// call half of the old list and half of the new.
	admin atomic.Pointer[[][sha256.Size]byte]
	// viewer is swapped whole by SetViewerTokens, as admin is.
	viewer atomic.Pointer[[][sha256.Size]byte]
	runs   RunResolver
}

// New builds an Authenticator. Admin tokens are kept only as digests.
func New(opts Options) (*Authenticator, error) {
	if opts.Runs == nil {
		return nil, errors.New("auth: Options.Runs is required")
	}
	a := &Authenticator{methods: map[string]Access{}, runs: opts.Runs}
	if err := a.SetAdminTokens(opts.AdminTokens); err != nil {
		return nil, err
	}
	if err := a.SetViewerTokens(opts.ViewerTokens); err != nil {
		return nil, err
	}
	for _, m := range apifacts.Methods() {
		a.methods[m.FullMethod] = declaredAccess(m.Facts.GetCredential())
	}
	a.set(Open, &healthpb.Health_ServiceDesc)
	reflection := Admin
	if opts.OpenReflection {
		reflection = Open
	}
	a.set(reflection, &reflectionpb.ServerReflection_ServiceDesc)
	a.methods[reflectionV1Alpha] = reflection
	return a, nil
}

// declaredAccess is the rule for the credential an API method declares.
func declaredAccess(c v1.Credential) Access {
	if c == v1.Credential_CREDENTIAL_RUN_TOKEN {
		return RunToken
	}
	return Admin
}

// SetAdminTokens replaces the admin tokens, for a reload of the token file:
// calls authenticated from now on use the new list. On error the old list
// stays.
func (a *Authenticator) SetAdminTokens(tokens []string) error {
	return setDigests(&a.admin, "admin", tokens)
}

// SetViewerTokens replaces the viewer tokens, as SetAdminTokens the admin
// tokens.
func (a *Authenticator) SetViewerTokens(tokens []string) error {
	return setDigests(&a.viewer, "viewer", tokens)
}

func setDigests(to *atomic.Pointer[[][sha256.Size]byte], kind string, tokens []string) error {
	digests := make([][sha256.Size]byte, 0, len(tokens))
	for i, tok := range tokens {
		if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("auth: %s token %d is empty or contains whitespace", kind, i+1)
		}
		digests = append(digests, sha256.Sum256([]byte(tok)))
	}
	to.Store(&digests)
	return nil
}

func (a *Authenticator) set(access Access, sd *grpc.ServiceDesc) {
	for _, m := range sd.Methods {
		a.methods["/"+sd.ServiceName+"/"+m.MethodName] = access
	}
	for _, s := range sd.Streams {
		a.methods["/"+sd.ServiceName+"/"+s.StreamName] = access
	}
}

// AdminRequired reports whether RunService needs an admin token.
func (a *Authenticator) AdminRequired() bool { return len(*a.admin.Load()) > 0 }

// Access returns the rule for a full method name ("/pkg.Service/Method").
func (a *Authenticator) Access(fullMethod string) Access {
	if acc, ok := a.methods[fullMethod]; ok {
		return acc
	}
	return Admin
}

// UnaryServerInterceptor authenticates unary calls and, for run-token
// methods, checks the request's run_id.
func (a *Authenticator) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	authn := selector.UnaryServerInterceptor(grpcauth.UnaryServerInterceptor(a.authenticate), selector.MatchFunc(a.needsAuth))
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return authn(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			if err := checkScope(ctx, req); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		})
	}
}

// StreamServerInterceptor authenticates streaming calls and, for run-token
// methods, checks the run_id of every message the handler receives.
func (a *Authenticator) StreamServerInterceptor() grpc.StreamServerInterceptor {
	authn := selector.StreamServerInterceptor(grpcauth.StreamServerInterceptor(a.authenticate), selector.MatchFunc(a.needsAuth))
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return authn(srv, ss, info, func(srv any, ss grpc.ServerStream) error {
			if _, scoped := RunFromContext(ss.Context()); scoped {
				ss = &scopedStream{ServerStream: ss}
			}
			return handler(srv, ss)
		})
	}
}

func (a *Authenticator) needsAuth(_ context.Context, c interceptors.CallMeta) bool {
	return a.Access(c.FullMethod()) != Open
}

// Error messages name the rule, never the token.
var (
	errMissing       = status.Error(codes.Unauthenticated, `missing credentials: send metadata "authorization: Bearer <token>"`)
	errMalformed     = status.Error(codes.Unauthenticated, `malformed authorization metadata: want "Bearer <token>"`)
	errBadAdmin      = status.Error(codes.Unauthenticated, "invalid admin token")
	errBadRun        = status.Error(codes.Unauthenticated, "invalid run token")
	errRunOnAdmin    = status.Error(codes.PermissionDenied, "a run token cannot call RunService: use an admin token")
	errAdminOnWorker = status.Error(codes.PermissionDenied, "an admin token cannot call WorkerService: use the run's token")
	errViewerOnAPI   = status.Error(codes.PermissionDenied, "a viewer token opens only the status page: use an admin token (RunService) or the run's token (WorkerService)")
	// The status page's refusals: its caller is a browser or curl, not a
	// gRPC client, so they speak of basic auth.
	errPageMissing = status.Error(codes.Unauthenticated, "missing credentials: a viewer or admin token as the password of HTTP basic auth (any user name), or as \"Authorization: Bearer <token>\"")
	errBadViewer   = status.Error(codes.Unauthenticated, "invalid viewer or admin token")
	errRunOnPage   = status.Error(codes.PermissionDenied, "a run token cannot open the status page: use a viewer or admin token")
)

// authenticate is the go-grpc-middleware AuthFunc. For run-token methods it
// puts the token's run into the context for checkScope.
func (a *Authenticator) authenticate(ctx context.Context) (context.Context, error) {
	method, _ := grpc.Method(ctx)
	token, present, err := bearer(ctx)
	if err != nil {
		return nil, err
	}
	switch a.Access(method) {
	case RunToken:
		if !present {
			return nil, errMissing
		}
		run, ok := a.runs.RunForToken(token)
		if !ok {
			switch {
			case a.isAdmin(token):
				return nil, errAdminOnWorker
			case a.isViewer(token):
				return nil, errViewerOnAPI
			}
			return nil, errBadRun
		}
		return context.WithValue(ctx, runKey{}, run), nil
	case Open:
		return ctx, nil
	default: // Admin
		if err := a.CheckAdmin(token, present); err != nil {
			return nil, err
		}
		return ctx, nil
	}
}

// CheckAdmin applies RunService's rule to a bearer token (present false:
// none was sent). The error is a gRPC status: Unauthenticated or
// PermissionDenied. A viewer token gets PermissionDenied: it opens only
// the status page (CheckViewer).
func (a *Authenticator) CheckAdmin(token string, present bool) error {
	switch {
	case present && a.isAdmin(token):
		return nil
	case present && a.isRunToken(token):
		return errRunOnAdmin
	case present && a.isViewer(token):
		// Refused even with no admin token configured: a viewer token is
		// meant to change nothing, wherever it is sent.
		return errViewerOnAPI
	case !a.AdminRequired():
		// Development mode: RunService is open, and any other credential
		// (say, a client's admin token for another coordinator) is
		// ignored.
		return nil
	case !present:
		return errMissing
	default:
		return errBadAdmin
	}
}

// CheckViewer is the status page's rule: a viewer or an admin token (a run
// token gets PermissionDenied). With neither kind configured the page is
// open, as RunService is.
func (a *Authenticator) CheckViewer(token string, present bool) error {
	switch {
	case present && (a.isAdmin(token) || a.isViewer(token)):
		return nil
	case present && a.isRunToken(token):
		return errRunOnPage
	case !a.ViewerRequired():
		return nil
	case !present:
		return errPageMissing
	default:
		return errBadViewer
	}
}

// ViewerRequired reports whether the status page needs a credential: some
// admin or viewer token is configured.
func (a *Authenticator) ViewerRequired() bool {
	return a.AdminRequired() || len(*a.viewer.Load()) > 0
}

func (a *Authenticator) isAdmin(token string) bool { return matches(a.admin.Load(), token) }

func (a *Authenticator) isViewer(token string) bool { return matches(a.viewer.Load(), token) }

// matches compares the token's digest with every digest in constant time,
// without stopping at the first match.
func matches(digests *[][sha256.Size]byte, token string) bool {
	d := sha256.Sum256([]byte(token))
	match := 0
	for _, digest := range *digests {
		match |= subtle.ConstantTimeCompare(d[:], digest[:])
	}
	return match == 1
}

func (a *Authenticator) isRunToken(token string) bool {
	_, ok := a.runs.RunForToken(token)
	return ok
}

// bearer reads the token from the authorization metadata. present is false
// when there is none; a value that is not "Bearer <token>" is an error.
func bearer(ctx context.Context) (token string, present bool, err error) {
	vals := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(vals) == 0 {
		return "", false, nil
	}
	if len(vals) > 1 {
		return "", true, errMalformed
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "bearer") || tok == "" || strings.ContainsAny(tok, " \t") {
		return "", true, errMalformed
	}
	return tok, true, nil
}

type runKey struct{}

// RunFromContext returns the run whose token authenticated the call; ok is
// false for calls that were not authenticated by a run token.
func RunFromContext(ctx context.Context) (runID string, ok bool) {
	runID, ok = ctx.Value(runKey{}).(string)
	return runID, ok
}

// runScoped is every WorkerService request.
type runScoped interface{ GetRunId() string }

// checkScope is the one place that keeps a run token inside its run: a
// request authenticated by a run token must name that run.
func checkScope(ctx context.Context, req any) error {
	run, ok := RunFromContext(ctx)
	if !ok {
		return nil
	}
	r, ok := req.(runScoped)
	if !ok {
		// A run-token method whose request has no run_id cannot be scoped:
		// refuse rather than let the token reach beyond its run.
		return status.Error(codes.PermissionDenied, "a run token cannot call this method")
	}
	if r.GetRunId() != run {
		return status.Errorf(codes.PermissionDenied, "run_id: the run token is not valid for run %s", quoteID(r.GetRunId()))
	}
	return nil
}

// maxQuotedID bounds an id quoted in a message. This check runs before
// validation, so the id may be as long as a request allows (1 MiB), and
// the message goes into the call's log line; a valid run id is at most
// 128 bytes.
const maxQuotedID = 128

func quoteID(id string) string {
	if len(id) > maxQuotedID {
		return strconv.Quote(id[:maxQuotedID]) + fmt.Sprintf("... (%d bytes)", len(id))
	}
	return strconv.Quote(id)
}

// scopedStream applies checkScope to each message the handler receives; a
// server-streaming handler receives its request this way before it runs.
type scopedStream struct{ grpc.ServerStream }

func (s *scopedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return checkScope(s.Context(), m)
}
