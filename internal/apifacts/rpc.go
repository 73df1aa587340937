// Package apifacts reads what the API declares in its proto, so that each
// fact is written once, next to the RPC, state or enum it is about:
//
//   - each RPC's facts: the (snapcoord.v1.rpc) method option of
//     proto/snapcoord/v1/options.proto, which says whether a call is safe to
//     retry, long-lived, routine, and which credential it needs. The
//     server's authentication, drain and logging and the Go client's retries
//     read them here (rpc.go);
//   - which run states are terminal: the (snapcoord.v1.terminal) option on
//     RunState's values (runstate.go);
//   - an enum value's text: its name without the enum's prefix, and back
//     (enum.go).
//
// The Python client reads the same options from its own descriptors. The
// package is shared by server/, client/ and cmd/, and is not public API:
// no user calls it. It is not under api/, which holds generated code only.
package apifacts

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Method is one RPC of the snapcoord.v1 API and its declared facts.
type Method struct {
	// FullMethod is the name gRPC uses, e.g.
	// "/snapcoord.v1.WorkerService/Heartbeat".
	FullMethod string
	// Streaming is true for a streaming RPC, false for a unary one.
	Streaming bool
	// Facts is the RPC's option; empty (every fact false, credential
	// unspecified) for an RPC that declares none.
	Facts *v1.RpcFacts
}

// methods are the API's RPCs, read once from the registered descriptors:
// every service of package snapcoord.v1, whichever file declares it.
var methods = loadMethods()

func loadMethods() []Method {
	var out []Method
	protoregistry.GlobalFiles.RangeFilesByPackage("snapcoord.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			svc := f.Services().Get(i)
			for j := range svc.Methods().Len() {
				out = append(out, method(svc, svc.Methods().Get(j)))
			}
		}
		return true
	})
	return out
}

func method(svc protoreflect.ServiceDescriptor, m protoreflect.MethodDescriptor) Method {
	facts, _ := proto.GetExtension(m.Options(), v1.E_Rpc).(*v1.RpcFacts)
	if facts == nil {
		facts = &v1.RpcFacts{}
	}
	return Method{
		FullMethod: "/" + string(svc.FullName()) + "/" + string(m.Name()),
		Streaming:  m.IsStreamingClient() || m.IsStreamingServer(),
		Facts:      facts,
	}
}

// Methods returns every RPC of the API with its facts.
func Methods() []Method {
	return append([]Method(nil), methods...)
}

// Set returns the full method names of the RPCs for which keep is true, as
// a set for a per-call lookup.
func Set(keep func(Method) bool) map[string]bool {
	set := map[string]bool{}
	for _, m := range methods {
		if keep(m) {
			set[m.FullMethod] = true
		}
	}
	return set
}

// RetrySafe is the clients' retry list: the unary RPCs declared safe to
// repeat when their reply was lost. A stream is never re-sent blindly.
func RetrySafe(m Method) bool { return m.Facts.GetRetrySafe() && !m.Streaming }

// LongLived keeps the RPCs that may stay open for a long time: streams that
// follow and long polls.
func LongLived(m Method) bool { return m.Facts.GetLongLived() }

// LongPoll keeps the unary RPCs that may wait for a long time.
func LongPoll(m Method) bool { return m.Facts.GetLongLived() && !m.Streaming }

// Routine keeps the fleet's RPCs: every worker's every few seconds, every
// rank's at each step or save.
func Routine(m Method) bool { return m.Facts.GetRoutine() }

// ReadOnly keeps the RPCs that change nothing the coordinator keeps.
func ReadOnly(m Method) bool { return m.Facts.GetReadOnly() }
