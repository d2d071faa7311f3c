//go:build integration && linux

package integration

import (
	"context"
	"strconv"
	"strings"
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

// TestBinaryNodePortAddressesPrimaryNodeIPsChange: the Node's primary IPs
// were read once at start, and a change of them was ignored: node ports
// stayed on the old address. Now, as kube-proxy ("NodeIPs changed for the
// node"), the proxy says why and exits with an error, so its DaemonSet
// runs it again on the new ones; a change of other Node fields does not.
func TestBinaryNodePortAddressesPrimaryNodeIPsChange(t *testing.T) {
	api := requireAPIServer(t)
	w := newWorld(t)
	kubeconfig := relayAPIServer(t, api, w.node)
	c := api.Client
	name := "primary-change"
	createNode(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: nodePodSide},
	}}})
	px := startCommand(t, "ip", "netns", "exec", string(w.node), proxyBin, "--kubeconfig", kubeconfig,
		"--portal=none", "--hostname-override="+name, "-v=2", "--nodeport-addresses=primary")
	px.waitLog(0, `"Node ports are served on this node's primary IPs.*from="Node `+name+`"`, 1, 60*time.Second)
	px.waitLog(0, `"Synced"`, 1, 60*time.Second)
	update := func(edit func(*corev1.Node)) {
		t.Helper()
		n, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edit(n)
		if _, err := c.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Another address, not a primary one: nothing changes.
	at := px.lineCount()
	update(func(n *corev1.Node) {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "198.18.10.9"})
	})
	time.Sleep(2 * time.Second) // an informer event arrives well within this
	if strings.Contains(px.logFrom(at), "NodeIPs changed") {
		t.Fatalf("a second InternalIP stopped the proxy:\n%s", px.logFrom(at))
	}
	update(func(n *corev1.Node) {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: nodeOutSide}}
	})
	px.waitLog(at, `"NodeIPs changed for the node; stopping".*198.18.11.1`, 1, 30*time.Second)
	if err := px.waitExit(30 * time.Second); err == nil {
		t.Errorf("the proxy exited with status 0, want an error so that it is restarted:\n%s", px.log())
	}
}
