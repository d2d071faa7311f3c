package proxyserver

import (
	"fmt"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// LoadKubeconfig reads and checks the kubeconfig the options name, when
// the proxy follows a cluster through one: a file that does not exist,
// does not parse, or gives no usable cluster is an error, found before
// the proxy starts (and by --init-only). It does not contact the server.
// Run watches the content read here when --config is given: a change of
// it ends the proxy, as a change of the --config file does.
func (c *Config) LoadKubeconfig() error {
	if c.Manifests != "" || c.Kubeconfig == "" {
		return nil
	}
	flag := "--kubeconfig"
	if c.fromFile["kubeconfig"] {
		flag = "--config " + c.ConfigFile + ": clientConnection.kubeconfig"
	}
	data, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	// As source.NewClient will read it (paths in it relative to it).
	overrides := &clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: c.Master}}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.Kubeconfig}, overrides)
	if _, err := loader.ClientConfig(); err != nil {
		return fmt.Errorf("%s %s: %w", flag, c.Kubeconfig, err)
	}
	c.kubeconfigData = data
	return nil
}
