// Package deploy holds the manifests that run kube-userspace-proxy in a
// cluster (kube-userspace-proxy.yaml: ServiceAccount, ClusterRole and
// binding, DaemonSet). The Go files only test that the manifests decode
// strictly as the Kubernetes types they claim to be.
package deploy
