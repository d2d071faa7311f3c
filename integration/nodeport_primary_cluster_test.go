//go:build integration

package integration

import (
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestBinaryNodePortAddressesPrimaryFromNode: following a cluster,
// --nodeport-addresses=primary serves node ports on the Node's InternalIP
// (here the node's pod-side address, not its default route's), as
// kube-proxy takes the node IPs it detects from its Node.
func TestBinaryNodePortAddressesPrimaryFromNode(t *testing.T) {
	api := requireAPIServer(t)
	for _, mode := range []string{"iptables", "none"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t)
			startBackend(t, w.backend, "8080=be1")
			kubeconfig := relayAPIServer(t, api, w.node)
			c := api.Client
			ns := testNamespace(t, c)
			name := "primary-" + mode
			createNode(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: nodePodSide},
			}}})
			px := startCommand(t, "ip", "netns", "exec", string(w.node), proxyBin, "--kubeconfig", kubeconfig,
				"--portal="+mode, "--hostname-override="+name, "-v=2", "--nodeport-addresses=primary")
			px.waitLog(0, `"Node ports are served on this node's primary IPs.*from="Node `+name+`" nodePortAddresses=\["198.18.10.1/32","::/0"\]`, 1, 60*time.Second)
			svc := createService(t, c, newService(ns, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }))
			putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.18.12.2")))
			np := strconv.Itoa(int(svc.Spec.Ports[0].NodePort))
			eventually(t, w.pod, "tcp", nodePodSide+":"+np, "be1:")
			expectNoReply(t, w.outside, "tcp", nodeOutSide+":"+np)
		})
	}
}
