package proxyserver

import (
	"fmt"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// LoadKubeconfig reads and checks the kubeconfig and --master the options
// name, when the proxy follows a cluster through them: a file that does
// not exist, is not a regular file of at most maxOptionsFileBytes, does
// not parse, or gives no usable cluster, and a server URL that does not
// parse, are errors, found before the proxy starts (and by --init-only).
// As source.NewClient will, it builds the API client's REST configuration
// and client (reading the TLS files they name), but it does not contact
// the server.
// Run watches the content read here when --config is given: a change of
// it ends the proxy, as a change of the --config file does.
func (c *Config) LoadKubeconfig() error {
	if c.Manifests != "" || c.Kubeconfig == "" && c.Master == "" {
		return nil
	}
	flag := "--kubeconfig"
	if c.fromFile["kubeconfig"] {
		flag = "--config " + c.ConfigFile + ": clientConnection.kubeconfig"
	}
	var data []byte
	if c.Kubeconfig != "" {
		var err error
		if data, err = readOptionsFile(c.Kubeconfig); err != nil {
			return fmt.Errorf("%s: %w", flag, err)
		}
		flag += " " + c.Kubeconfig
	}
	if c.Master != "" {
		flag = strings.TrimPrefix(flag+" with --master "+c.Master, "--kubeconfig with ")
	}
	// As source.NewClient will read it (paths in it relative to it).
	overrides := &clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: c.Master}}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.Kubeconfig}, overrides)
	restConfig, err := loader.ClientConfig()
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	// The server URL is parsed, and the TLS files read, only here.
	if _, err := kubernetes.NewForConfig(restConfig); err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	c.kubeconfigData = data
	return nil
}
