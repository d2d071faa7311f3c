//go:build integration && !linux

package integration

import "os/exec"

// killWithParent does nothing here: only Linux has a parent-death signal.
func killWithParent(*exec.Cmd) {}
