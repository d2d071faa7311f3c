//go:build tools

// Package kube records the commands that hack/kube-tools.sh builds, so that
// go mod tidy keeps their dependencies. The build tag keeps it out of every
// build.
package kube

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
