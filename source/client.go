package source

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/buildinfo"
)

// NewClient returns a client of the API server, as kube-proxy builds its
// own: from the kubeconfig file and/or master URL (--kubeconfig, --master;
// the URL overrides the file's server), or, when both are empty, from the
// service account of the pod it runs in. qps and burst limit its request
// rate (--kube-api-qps, --kube-api-burst; zero means client-go's 5 and 10);
// contentType is the encoding it sends and asks for
// (--kube-api-content-type, e.g. "application/vnd.kubernetes.protobuf"); if
// empty, JSON; acceptContentTypes is its Accept header
// (clientConnection.acceptContentTypes of a --config file), if empty
// client-go's: the content type, with JSON as a fallback. The client logs
// when the API server stops answering and when it answers again (see
// contact).
func NewClient(kubeconfig, master string, qps float32, burst int, contentType, acceptContentTypes string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	hint := ""
	if kubeconfig == "" && master == "" {
		klog.InfoS("Neither --kubeconfig nor --master was given, using the in-cluster configuration")
		cfg, err = rest.InClusterConfig()
		hint = inClusterHint
	} else {
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
			&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: master}},
		).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("api client: %w", err)
	}
	cfg.ContentType = contentType
	cfg.AcceptContentTypes = acceptContentTypes
	cfg.QPS = qps
	cfg.Burst = burst
	// The proxy's name and version, not client-go's v0.0.0 and $Format,
	// in the API server's audit log and metrics.
	cfg.UserAgent = buildinfo.UserAgent()
	cfg.Wrap(newContact(hint).wrap)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("api client: %w", err)
	}
	return client, nil
}
