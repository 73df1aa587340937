// What the API declares about run states: which of
// them are terminal, from the (snapcoord.v1.terminal) option on RunState's
// values (proto/snapcoord/v1/run.proto). The engine and the Go client ask
// here; the Python client reads the same option from its descriptors, so
// the set is written once.

package apifacts

import (
	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// terminal is indexed by state number.
var terminal = loadTerminal()

func loadTerminal() []bool {
	values := v1.RunState(0).Descriptor().Values()
	out := make([]bool, 0, values.Len())
	for i := range values.Len() {
		v := values.Get(i)
		for int(v.Number()) >= len(out) {
			out = append(out, false)
		}
		out[v.Number()] = proto.GetExtension(v.Options(), v1.E_Terminal).(bool)
	}
	return out
}

// Terminal reports whether a run in state s is over: it takes no new
// reports, answers every CompleteStep with STOP and never leaves s.
func Terminal(s v1.RunState) bool {
	return s >= 0 && int(s) < len(terminal) && terminal[s]
}
