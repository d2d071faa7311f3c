package proxyserver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/source"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// primaryNodeWait is how long Run waits for its Node to read the primary
// IPs of --nodeport-addresses=primary from, as kube-proxy waits for its
// node IPs.
const primaryNodeWait = 30 * time.Second

// primaryNodePortCIDRs returns the node-port CIDRs of
// --nodeport-addresses=primary: the node's primary IP of each family, as
// kube-proxy takes them. Following a cluster, they are the Node's first
// InternalIP of each family (else its first ExternalIP), as kube-proxy
// detects its node IPs; with --manifests, or when the Node cannot be read,
// the addresses of the interface of the default route of each family. A
// family with no primary IP serves node ports on every address of it, as
// kube-proxy's proxier of a family without a node IP does.
//
// fromNode are the primary IPs read from the Node, or nil when they were
// not: Run then watches the Node (watchPrimaryIPs) and stops when they
// change, as kube-proxy does.
func primaryNodePortCIDRs(ctx context.Context, cfg *Config, node string) (cidrs []netip.Prefix, fromNode []netip.Addr) {
	var addrs []netip.Addr
	from := "the default route's interface"
	if cfg.Manifests == "" {
		var err error
		if addrs, err = nodePrimaryIPs(ctx, cfg, node); err == nil {
			from = "Node " + node
			fromNode = addrs
		} else if ctx.Err() != nil {
			return nil, nil // stopping: Run says so
		} else {
			klog.ErrorS(err, "Cannot read this node's primary IPs for --nodeport-addresses=primary from its Node; using the addresses of the default route's interface", "node", node)
		}
	}
	if len(addrs) == 0 {
		var err error
		if addrs, err = defaultRouteAddrs(); err != nil {
			klog.ErrorS(err, "Cannot read the addresses of the default route's interface for --nodeport-addresses=primary")
		}
	}
	for _, a := range addrs {
		cidrs = append(cidrs, netip.PrefixFrom(a, a.BitLen()))
	}
	out := state.NodePortCIDRs(cidrs)
	if len(cidrs) == 0 {
		klog.InfoS("No primary IP found for --nodeport-addresses=primary: node ports are served on every address", "from", from)
	} else {
		klog.InfoS("Node ports are served on this node's primary IPs (--nodeport-addresses=primary)", "from", from, "nodePortAddresses", out)
	}
	return out, fromNode
}

// errNodeIPsChanged is why Run stops when the Node's primary IPs, which
// --nodeport-addresses=primary serves node ports on, change.
var errNodeIPsChanged = errors.New("the node's primary IPs changed")

// watchPrimaryIPs watches the Node node until its primary IPs (primaryIPs)
// differ from was, then returns an error wrapping errNodeIPsChanged that
// says how; or nil when ctx ends. A Node without any, or gone, changes
// nothing (kube-proxy goes on with the IPs it has too).
func watchPrimaryIPs(ctx context.Context, cfg *Config, node string, was []netip.Addr) error {
	client, err := source.NewClient(cfg.Kubeconfig, cfg.Master, cfg.KubeAPIQPS, cfg.KubeAPIBurst, cfg.KubeAPIContentType, cfg.KubeAPIAcceptContentTypes)
	if err != nil {
		return nil // read once at start: the proxy goes on with them
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, node).String()
		}))
	changed := make(chan []netip.Addr, 1)
	check := func(obj any) {
		n, ok := obj.(*v1.Node)
		if !ok || n.Name != node {
			return
		}
		if now := primaryIPs(n); len(now) > 0 && !slices.Equal(now, was) {
			select {
			case changed <- now:
			default:
			}
		}
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    check,
		UpdateFunc: func(_, obj any) { check(obj) },
	}); err != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	factory.Start(ctx.Done())
	select {
	case <-ctx.Done():
		return nil
	case now := <-changed:
		return fmt.Errorf("%w (node %s: %v, was %v): exiting so that node ports are served on the new ones, as kube-proxy does (a DaemonSet restarts the proxy)", errNodeIPsChanged, node, now, was)
	}
}

// nodePrimaryIPs reads the Node's primary IPs, waiting up to
// primaryNodeWait for it to exist.
func nodePrimaryIPs(parent context.Context, cfg *Config, node string) ([]netip.Addr, error) {
	client, err := source.NewClient(cfg.Kubeconfig, cfg.Master, cfg.KubeAPIQPS, cfg.KubeAPIBurst, cfg.KubeAPIContentType, cfg.KubeAPIAcceptContentTypes)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(parent, primaryNodeWait)
	defer cancel()
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			if ips := primaryIPs(n); len(ips) > 0 {
				return ips, nil
			}
			err = fmt.Errorf("node %s has no InternalIP or ExternalIP address", node)
		}
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return nil, err // waiting will not help
		}
		select {
		case <-ctx.Done():
			if stopped := context.Cause(parent); stopped != nil {
				return nil, stopped // the proxy is stopping: not a timeout
			}
			return nil, fmt.Errorf("read Node %s: %w (gave up after %v)", node, err, primaryNodeWait)
		case <-time.After(time.Second):
		}
	}
}

// primaryIPs returns a Node's first InternalIP of each IP family, else its
// first ExternalIP of that family (the order of k8s.io/component-helpers'
// GetNodeHostIPs, which kube-proxy's node IPs come from).
func primaryIPs(n *v1.Node) []netip.Addr {
	var out []netip.Addr
	for _, ipv6 := range []bool{false, true} {
	types:
		for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
			for _, a := range n.Status.Addresses {
				ip, err := netip.ParseAddr(a.Address)
				if a.Type == t && err == nil && ip.Unmap().Is6() == ipv6 {
					out = append(out, ip.Unmap())
					break types
				}
			}
		}
	}
	return out
}
