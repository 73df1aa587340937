package client

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/health" // client-side health checking, which leaderServiceConfig turns on
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Addrs splits a comma-separated address list (--addr, SNAPCOORD_ADDR),
// dropping blanks and repeats, in order.
func Addrs(list string) []string {
	var out []string
	for a := range strings.SplitSeq(list, ",") {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// leaderServiceConfig sends every call to the newest coordinator whose
// WorkerService health is SERVING (leaderPolicy): the leader among
// coordinators sharing an etcd prefix (followers report NOT_SERVING), or a
// coordinator on bbolt (SERVING, as it leads alone). The policy connects
// to every address, and client-side health checking watches each one's
// status, so a new leader is used as soon as it reports SERVING, with no
// call lost to a follower first. A health check covers one service per
// connection: a coordinator reports the same status for RunService and
// WorkerService, so WorkerService, the one workers use, stands for both. A
// server without the health service counts as healthy (grpc-go disables
// the check then).
var leaderServiceConfig = fmt.Sprintf(`{
  "loadBalancingConfig": [{%q: {}}],
  "healthCheckConfig": {"serviceName": %q}
}`, leaderPolicy, v1.WorkerService_ServiceDesc.ServiceName)

// dialTarget is the gRPC target for addr, the options it needs, and the
// watch of its leader (nil for one address). One address is dialed as it
// always was (pick_first, no health checking). Several are handed to the
// channel by a manual resolver, with leaderServiceConfig: the client
// follows the leader across failovers by itself. The leader named in a
// follower's NOT_LEADER answer is not dialed: the address it advertises
// may not be one this client reaches it at (a NAT, another name), and the
// health checks find it among the addresses given as fast as a redirect
// would.
func dialTarget(addr string) (string, []grpc.DialOption, *leaderWatch, error) {
	addrs := Addrs(addr)
	switch len(addrs) {
	case 0:
		return "", nil, nil, errors.New("client: no coordinator address")
	case 1:
		return addrs[0], nil, nil, nil
	}
	eps := make([]resolver.Endpoint, len(addrs))
	for i, a := range addrs {
		// ServerName: each address is its own authority, for TLS
		// verification and the :authority header, as when dialed alone.
		eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: a, ServerName: a}}}
	}
	watch := newLeaderWatch()
	r := manual.NewBuilderWithScheme("snapcoord")
	r.InitialState(resolver.State{Endpoints: eps, Attributes: watch.attributes()})
	return r.Scheme() + ":///coordinators", []grpc.DialOption{grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(leaderServiceConfig)}, watch, nil
}

// reasonNotLeader is the ErrorInfo reason of a coordinator that is not
// the leader; its metadata "leader" holds the leader's advertised address,
// empty when none is known.
const reasonNotLeader = "NOT_LEADER"

// reasonOutcomeUnknown is the ErrorInfo reason of a call whose change was
// made but whose commit the coordinator could not confirm before answering:
// it may still take effect.
const reasonOutcomeUnknown = "OUTCOME_UNKNOWN"

// OutcomeUnknown reports whether err says that the call's change may or
// may not have taken effect (UNAVAILABLE with reason OUTCOME_UNKNOWN): the
// coordinator lost its leadership or its etcd quorum while the commit
// waited, or the call's deadline came first. The client repeats the calls
// that are safe to repeat, whose repeat answers what the first attempt
// did, so a caller sees it only from a call that is not (ReissueRunToken)
// or whose retries ran out; asking again (GetRun) tells what happened.
func OutcomeUnknown(err error) bool { return errorInfo(err).GetReason() == reasonOutcomeUnknown }

// errorInfo is the ErrorInfo of snapcoord's domain in err's status, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.GetDomain() == errorDomain {
			return info
		}
	}
	return nil
}

// NotLeader reports whether err is a follower's refusal (UNAVAILABLE with
// reason NOT_LEADER), and the leader it named ("" if it knew none). The
// follower refused the call before doing anything, so any call, whatever
// its method, can be made again.
func NotLeader(err error) (leader string, ok bool) {
	if info := errorInfo(err); info.GetReason() == reasonNotLeader {
		return info.GetMetadata()["leader"], true
	}
	return "", false
}
