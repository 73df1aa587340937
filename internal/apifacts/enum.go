// The one way the coordinator and its tools write a
// value of an API enum as text, and read it back: its name without the
// enum's prefix (RUN_STATE_RUNNING is RUNNING), as it is or in lower case. The prefix is
// read from the enum's descriptor (its zero value is PREFIX_UNSPECIFIED, as
// buf lint requires), so no caller spells it out.

package apifacts

import (
	"strconv"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// EnumName is e's value name without the enum's prefix: RUNNING for
// RUN_STATE_RUNNING. A number the enum does not declare is written as the
// number, as the generated String method does.
func EnumName(e protoreflect.Enum) string {
	values := e.Descriptor().Values()
	v := values.ByNumber(e.Number())
	if v == nil {
		return strconv.Itoa(int(e.Number()))
	}
	return strings.TrimPrefix(string(v.Name()), prefix(values))
}

// prefix is the enum's prefix: its zero value's name without UNSPECIFIED.
func prefix(values protoreflect.EnumValueDescriptors) string {
	if zero := values.ByNumber(0); zero != nil {
		return strings.TrimSuffix(string(zero.Name()), "UNSPECIFIED")
	}
	return ""
}

// EnumLower is EnumName in lower case: trainer_checkpoint for
// SNAPSHOT_REASON_TRAINER_CHECKPOINT.
func EnumLower(e protoreflect.Enum) string { return strings.ToLower(EnumName(e)) }

// ParseEnum reads a value of E back: its short name in any case (running,
// RUNNING) or its full name (RUN_STATE_RUNNING). The zero (unspecified)
// value is not one a user may name.
func ParseEnum[E interface {
	~int32
	protoreflect.Enum
}](s string) (E, bool) {
	var zero E
	values := zero.Descriptor().Values()
	p := prefix(values)
	v := values.ByName(protoreflect.Name(p + strings.TrimPrefix(strings.ToUpper(s), p)))
	if v == nil || v.Number() == 0 {
		return zero, false
	}
	return E(v.Number()), true
}
