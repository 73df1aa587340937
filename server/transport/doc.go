// Package transport adapts the engine to the generated gRPC service
// interfaces. Each handler calls the engine and maps its error, nothing else:
// validation happens before (protovalidate interceptors) and all domain logic
// after (server/engine), so this layer stays too thin to hide bugs.
package transport

import (
	"context"

	"github.com/snapcoord/snapcoord/server/engine"
)

// Engines gives each call the engine that answers it. A coordinator has
// one engine per term it leads (see server/leader.Gate), so the handlers
// ask for it per call instead of holding one.
type Engines interface {
	For(ctx context.Context) *engine.Engine
}
