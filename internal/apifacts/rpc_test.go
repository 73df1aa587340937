package apifacts

import (
	"testing"

	"google.golang.org/grpc"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// TestEveryServedMethodIsRead fails when a method the server registers is
// missing from Methods, so its facts would be ignored.
func TestEveryServedMethodIsRead(t *testing.T) {
	read := Set(func(Method) bool { return true })
	for _, sd := range []*grpc.ServiceDesc{&v1.RunService_ServiceDesc, &v1.WorkerService_ServiceDesc} {
		for _, m := range sd.Methods {
			if name := "/" + sd.ServiceName + "/" + m.MethodName; !read[name] {
				t.Errorf("%s: not read", name)
			}
		}
		for _, s := range sd.Streams {
			if name := "/" + sd.ServiceName + "/" + s.StreamName; !read[name] {
				t.Errorf("%s: not read", name)
			}
		}
	}
}

// TestFactsAreDeclaredConsistently checks the declarations a new RPC could
// get wrong: a credential left unspecified (it would silently need the
// admin token), or facts that mean nothing for a stream.
func TestFactsAreDeclaredConsistently(t *testing.T) {
	for _, m := range Methods() {
		if m.Facts.GetCredential() == v1.Credential_CREDENTIAL_UNSPECIFIED {
			t.Errorf("%s: declares no credential", m.FullMethod)
		}
		if m.Streaming && m.Facts.GetRetrySafe() {
			t.Errorf("%s: a stream declared retry_safe: it is never re-sent", m.FullMethod)
		}
	}
}

// TestSetsFromTheProto pins a few facts as the server and clients see them,
// so that a reader that lost the option (all facts false) fails here.
func TestSetsFromTheProto(t *testing.T) {
	poll, stream := v1.WorkerService_PollCommands_FullMethodName, v1.WorkerService_StreamCommands_FullMethodName
	checks := []struct {
		name string
		set  map[string]bool
		in   []string
		out  []string
	}{
		{"RetrySafe", Set(RetrySafe), []string{v1.RunService_GetRun_FullMethodName, poll}, []string{v1.RunService_ReissueRunToken_FullMethodName, stream}},
		{"LongLived", Set(LongLived), []string{poll, stream, v1.RunService_WatchRun_FullMethodName}, []string{v1.WorkerService_Heartbeat_FullMethodName}},
		{"LongPoll", Set(LongPoll), []string{poll}, []string{stream}},
		{"Routine", Set(Routine), []string{poll, v1.WorkerService_Heartbeat_FullMethodName, v1.WorkerService_CompleteStep_FullMethodName}, []string{v1.WorkerService_RegisterWorker_FullMethodName, v1.RunService_TriggerDeadline_FullMethodName}},
	}
	for _, c := range checks {
		for _, m := range c.in {
			if !c.set[m] {
				t.Errorf("%s lacks %s", c.name, m)
			}
		}
		for _, m := range c.out {
			if c.set[m] {
				t.Errorf("%s holds %s", c.name, m)
			}
		}
	}
}
