// Package transport adapts the engine to the generated gRPC service
// interfaces. Each handler calls the engine and maps its error, nothing else:
// validation happens before (protovalidate interceptors) and all domain logic
// after (server/engine), so this layer stays too thin to hide bugs.
package transport
