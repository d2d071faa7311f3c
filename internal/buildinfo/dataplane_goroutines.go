//go:build !linux || goroutines

package buildinfo

// DataPlane names how this build serves connections: goroutines per
// listener, connection direction and session, as off Linux or built with
// -tags goroutines (package userspace).
const DataPlane = "goroutines"
