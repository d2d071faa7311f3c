package source

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

const demoManifest = `# Demo: one web service with two backends on this host.
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  clusterIP: 198.18.0.10
  ports:
  - name: http
    port: 80
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
- addresses: ["127.0.0.1"]
- addresses: ["127.0.0.2"]
  conditions: {ready: false, serving: true, terminating: true}
---
apiVersion: v1
kind: Service
metadata:
  name: dns
spec:
  ports:
  - port: 53
    protocol: UDP
`

func TestParseManifests(t *testing.T) {
	svcs, sl, warnings, err := ParseManifests("demo.yaml", []byte(demoManifest))
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("unexpected warnings: %v", warnings)
	}
	if len(svcs) != 2 || len(sl) != 1 {
		t.Fatalf("got %d services and %d slices, want 2 and 1", len(svcs), len(sl))
	}
	if svcs[1].Namespace != "default" {
		t.Errorf("namespace of dns: got %q, want default", svcs[1].Namespace)
	}

	snap, problems := BuildSnapshot(svcs, sl, Options{AllowLoopback: true, AllowNoClusterIP: true})
	checkProblems(t, problems, nil)
	web := snap.Get(state.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: state.TCP})
	dns := snap.Get(state.ServicePortName{Namespace: "default", Name: "dns", Protocol: state.UDP})
	if web == nil || dns == nil {
		t.Fatalf("got ports %v", snap.Names())
	}
	if got := addrs(web.ClusterEndpoints); !slices.Equal(got, []string{"127.0.0.1:8080"}) {
		t.Errorf("web endpoints: got %q", got)
	}
	if len(dns.ClusterIPs) != 0 || dns.Port != 53 {
		t.Errorf("dns: got %s", describe(dns))
	}
}

// A slice port written without a name or protocol gets the API server's
// defaults ("" and TCP), so it feeds the Service's unnamed port as it would
// in a cluster instead of being skipped.
func TestParseManifestsDefaultsSlicePorts(t *testing.T) {
	data := `apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [127.0.0.1]}]
---
apiVersion: v1
kind: Service
metadata: {name: dns}
spec: {ports: [{port: 53, protocol: UDP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{port: 5353, protocol: UDP}]
endpoints: [{addresses: [127.0.0.1]}]
`
	svcs, sl, warnings, err := ParseManifests("demo.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("unexpected warnings: %v", warnings)
	}
	snap, problems := BuildSnapshot(svcs, sl, Options{AllowLoopback: true, AllowNoClusterIP: true})
	checkProblems(t, problems, nil)
	for name, want := range map[state.ServicePortName]string{
		{Namespace: "default", Name: "web", Protocol: state.TCP}: "127.0.0.1:8080",
		{Namespace: "default", Name: "dns", Protocol: state.UDP}: "127.0.0.1:5353",
	} {
		sp := snap.Get(name)
		if sp == nil {
			t.Fatalf("%s: not in the snapshot (ports %v)", name, snap.Names())
		}
		if got := addrs(sp.ClusterEndpoints); !slices.Equal(got, []string{want}) {
			t.Errorf("%s endpoints: got %q, want %s", name, got, want)
		}
	}
}

func TestParseManifestsForms(t *testing.T) {
	tests := []struct {
		name                   string
		data                   string
		wantServices, wantSlcs int
		wantWarnings           []string
	}{
		{
			name:         "JSON",
			data:         `{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}`,
			wantServices: 1,
		},
		{
			name: "a stream of JSON objects, as kubectl reads a JSON file",
			data: `{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
{
  "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
  "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
  "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]
} {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns"}, "spec": {"ports": [{"port": 53, "protocol": "UDP"}]}}
`,
			wantServices: 2, wantSlcs: 1,
		},
		{
			name:         "YAML in flow style is not taken for JSON",
			data:         "{apiVersion: v1, kind: Service, metadata: {name: web}, spec: {ports: [{port: 80}]}}\n",
			wantServices: 1,
		},
		{
			name: "Services that get no endpoints or are left to others say so",
			data: `apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: other, labels: {service.kubernetes.io/service-proxy-name: cilium}}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: nohead, labels: {service.kubernetes.io/headless: ""}}
spec: {selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: sliced}
spec: {selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sliced-1, labels: {kubernetes.io/service-name: sliced}}
addressType: IPv4
`,
			wantServices: 4, wantSlcs: 1,
			wantWarnings: []string{
				"demo.yaml: document 1 (Service default/web): spec.selector: selects pods, which only a cluster has, and no EndpointSlice in the file has label kubernetes.io/service-name: web; it has no endpoints",
				`demo.yaml: document 2 (Service default/other): metadata.labels: label service.kubernetes.io/service-proxy-name="cilium" gives it to another proxy; skipped, as kube-proxy does`,
				"demo.yaml: document 3 (Service default/nohead): metadata.labels: label service.kubernetes.io/headless marks it headless; skipped, as kube-proxy does",
			},
		},
		{
			name: "v1 List",
			data: `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web}
  spec: {ports: [{port: 80}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: "", port: 8080}]
  endpoints: [{addresses: [10.0.0.1]}]
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: config}
`,
			wantServices: 1, wantSlcs: 1,
			wantWarnings: []string{`demo.yaml: document 1 (ConfigMap default/config): items[2]: apiVersion "v1" kind "ConfigMap" is not a Service or EndpointSlice; skipped`},
		},
		{
			name: "ServiceList and EndpointSliceList",
			data: `apiVersion: v1
kind: ServiceList
items:
- metadata: {name: web}
  spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSliceList
items:
- metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
  addressType: IPv6
`,
			wantServices: 1, wantSlcs: 1,
		},
		{
			name: "unknown kinds and API versions are skipped with a warning",
			data: `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w, namespace: demo}
---
apiVersion: v1
kind: Endpoints
metadata: {name: web}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80}]}
`,
			wantServices: 1,
			wantWarnings: []string{
				`demo.yaml: document 1 (Deployment default/web): apiVersion "apps/v1" kind "Deployment" is not a Service or EndpointSlice; skipped`,
				`demo.yaml: document 2 (Widget demo/w): apiVersion "example.com/v1" kind "Widget" is not a Service or EndpointSlice; skipped`,
				`demo.yaml: document 3 (Endpoints default/web): apiVersion "v1" kind "Endpoints" is not a Service or EndpointSlice; skipped (write a discovery.k8s.io/v1 EndpointSlice instead`,
			},
		},
		{
			name: "comment-only documents are not counted; a file of comments is empty, not an error",
			data: "# nothing yet\n---\n# still nothing\n---\n",
		},
		{
			name: "helpful warnings",
			data: `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.1, 10.0.0.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-1, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec: {type: ExternalName, externalName: example.com}
`,
			wantServices: 2, wantSlcs: 2,
			wantWarnings: []string{
				"demo.yaml: document 1 (Service default/web): spec.ports[0].nodePort: not set: no node port is served",
				"demo.yaml: document 2 (EndpointSlice default/web-1): endpoints[0].addresses: only the first address is used",
				`demo.yaml: document 2 (EndpointSlice default/web-1): ports[0]: port name "http" with protocol TCP matches no port of Service default/web`,
				"demo.yaml: document 3 (EndpointSlice default/api-1): metadata.labels: names Service default/api, which is not in the file",
				"demo.yaml: document 4 (Service default/ext): type ExternalName is served by DNS, not by the proxy; skipped",
			},
		},
		{
			// All three are valid to the API server: kube-proxy ignores a
			// slice without the label and a port without a number, and
			// a shared cluster IP with no port in common can be served.
			name: "valid objects the proxy serves in part",
			data: `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: custom-1}
addressType: IPv4
ports: [{port: 80}]
endpoints: [{addresses: [198.18.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: any}, {port: 8080}]
endpoints: [{addresses: [198.18.0.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{port: 5353}]
endpoints: [{addresses: [198.18.0.3]}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 198.18.0.10, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: dns}
spec: {clusterIP: 198.18.0.10, ports: [{port: 53, protocol: UDP}]}
---
apiVersion: v1
kind: Service
metadata: {name: low}
spec: {type: NodePort, ports: [{port: 80, nodePort: 8080}]}
`,
			wantServices: 3, wantSlcs: 2,
			wantWarnings: []string{
				`demo.yaml: document 3 (EndpointSlice default/dns-1): ports[0].protocol: port "" is TCP here but UDP in Service default/dns, so it matches nothing (a slice port without a protocol is TCP)`,
				"demo.yaml: document 6 (Service default/low): spec.ports[0].nodePort: 8080 is outside 30000-32767, the default --service-node-port-range: a cluster with that range would refuse it (served here all the same)",
				"demo.yaml: document 1 (EndpointSlice default/custom-1): metadata.labels: no kubernetes.io/service-name label, which names the Service a slice belongs to; ignored",
				"demo.yaml: document 2 (EndpointSlice default/web-1): ports[0].port: not set: the port is skipped, as kube-proxy skips it",
				"demo.yaml: document 5 (Service default/dns): spec.clusterIP: 198.18.0.10 is also the cluster IP of Service default/web (document 4); a cluster gives each Service its own",
			},
		},
		{
			// The health check listens on TCP, so a UDP node port of its
			// number takes nothing from it; and a healthCheckNodePort is
			// served only for a LoadBalancer with externalTrafficPolicy:
			// Local, so elsewhere it takes no port. A cluster would refuse
			// both, so each is a warning.
			name: "health check node ports that collide with nothing served",
			data: lbService("a", 30100, 30080) + `---
apiVersion: v1
kind: Service
metadata: {name: dns}
spec: {type: NodePort, ports: [{port: 53, protocol: UDP, nodePort: 30100}]}
---
` + strings.Replace(lbService("cluster", 30080, 30081), "externalTrafficPolicy: Local", "externalTrafficPolicy: Cluster", 1),
			wantServices: 3,
			wantWarnings: []string{
				"demo.yaml: document 2 (Service default/dns): spec.ports[0].nodePort: node port 30100 is also the health check node port of Service default/a (document 1): a cluster gives each node port number to one Service, whatever the protocol, and would refuse it (served here all the same)",
				"demo.yaml: document 3 (Service default/cluster): spec.healthCheckNodePort: 30080 is served only for a LoadBalancer with externalTrafficPolicy: Local, so it is ignored here (a cluster would refuse it)",
			},
		},
		{
			// A Service's health check port on the number of its own UDP
			// node port: the health check listens on TCP, so nothing
			// collides here, but a cluster allocates it a number of its
			// own (xa53).
			name: "a health check node port on the Service's own UDP node port",
			data: `apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 30104
  ports: [{port: 53, protocol: UDP, nodePort: 30104}]
`,
			wantServices: 1,
			wantWarnings: []string{
				"demo.yaml: document 1 (Service default/lb): spec.healthCheckNodePort: health check node port 30104 is also a UDP node port of this Service: a cluster allocates the health check port a number of its own, and would refuse it (served here all the same)",
			},
		},
		{
			// The API server warns of these (GetWarningsForIP) and
			// takes them; so does the proxy. Ingress IPs and endpoint
			// addresses it takes without a word.
			name: "IPv6 addresses not in canonical form",
			data: `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: "FD5E:B1B5::10"
  externalIPs: ["fd5e:b1b5::20", "fd5e:b1b5:0:0:0:0:0:21"]
  ports: [{port: 80}]
status:
  loadBalancer:
    ingress: [{ip: "fd5e:b1b5:0::30"}]
---
apiVersion: v1
kind: Service
metadata: {name: dual}
spec:
  clusterIP: 198.18.0.10
  clusterIPs: [198.18.0.10, "fd5e:b1b5:0::40"]
  ipFamilyPolicy: PreferDualStack
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
endpoints: [{addresses: ["FD5E:B1B5::2"]}]
ports: [{port: 80}]
`,
			wantServices: 2,
			wantSlcs:     1,
			wantWarnings: []string{
				"demo.yaml: document 1 (Service default/web): spec.clusterIP: FD5E:B1B5::10 is an IPv6 address not in its canonical form: the API server takes it with a warning (write fd5e:b1b5::10)",
				"demo.yaml: document 1 (Service default/web): spec.externalIPs[1]: fd5e:b1b5:0:0:0:0:0:21 is an IPv6 address not in its canonical form: the API server takes it with a warning (write fd5e:b1b5::21)",
				"demo.yaml: document 2 (Service default/dual): spec.clusterIPs[1]: fd5e:b1b5:0::40 is an IPv6 address not in its canonical form: the API server takes it with a warning (write fd5e:b1b5::40)",
			},
		},
		{
			// A node port number of one protocol in two Services: a
			// cluster would refuse it; both are served. One Service's
			// ports of two protocols may share the number.
			name: "a node port number in two Services, by protocol",
			data: `apiVersion: v1
kind: Service
metadata: {name: dns}
spec: {type: NodePort, ports: [{name: udp, port: 53, protocol: UDP, nodePort: 30053}, {name: tcp, port: 53, nodePort: 30053}]}
---
apiVersion: v1
kind: Service
metadata: {name: other}
spec: {type: NodePort, ports: [{port: 80, protocol: SCTP, nodePort: 30053}]}
`,
			wantServices: 2,
			wantWarnings: []string{
				"demo.yaml: document 2 (Service default/other): spec.ports[0].nodePort: node port 30053 is also a UDP node port of Service default/dns (document 1): a cluster gives each node port number to one Service, whatever the protocol, and would refuse it (served here all the same)",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svcs, sl, warnings, err := ParseManifests("demo.yaml", []byte(tc.data))
			if err != nil {
				t.Fatal(err)
			}
			if len(svcs) != tc.wantServices || len(sl) != tc.wantSlcs {
				t.Errorf("got %d services and %d slices, want %d and %d", len(svcs), len(sl), tc.wantServices, tc.wantSlcs)
			}
			checkProblems(t, warnings, tc.wantWarnings)
		})
	}
}

func TestParseManifestsEmpty(t *testing.T) {
	for _, data := range []string{"", "\n  \n"} {
		_, _, _, err := ParseManifests("demo.yaml", []byte(data))
		if !errors.Is(err, ErrEmptyManifest) || !strings.Contains(err.Error(), "demo.yaml") {
			t.Errorf("%q: got %v, want ErrEmptyManifest naming the file", data, err)
		}
	}
}

// TestClusterScopedKindsHaveNoNamespace: an object of a cluster-scoped
// kind the proxy skips (Namespace, ClusterRole) is named without a
// namespace, where "Namespace default/x" named nothing that exists; other
// kinds without one are in "default", as kubectl puts them, the proxy's
// own included, even when they do not decode.
func TestClusterScopedKindsHaveNoNamespace(t *testing.T) {
	data := `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80, protocl: TCP}]}
---
apiVersion: v1
kind: Servcie
metadata: {name: typo}
`
	_, _, warnings, err := ParseManifests("demo.yaml", []byte(data))
	var got []string
	for _, e := range append(slices.Clone(warnings), flatten(err)...) {
		var oe *ObjectError
		if errors.As(e, &oe) {
			got = append(got, oe.Object())
		}
	}
	slices.Sort(got)
	want := []string{"ClusterRole reader", "ConfigMap default/settings", "Namespace x", "Servcie default/typo", "Service default/web"}
	if !slices.Equal(got, want) {
		t.Errorf("objects named %q, want %q", got, want)
	}
}

// TestWarningsInDocumentOrder: warnings come in the order of the file, by
// document, then item of a List, then line, though the checks across
// objects find theirs after every document is read; errors too.
func TestWarningsInDocumentOrder(t *testing.T) {
	data := `apiVersion: v1
kind: Service
metadata: {name: a, namespace: x}
spec: {clusterIP: 198.18.1.1, selector: {app: a}, ports: [{port: 80}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c, namespace: x}
---
apiVersion: v1
kind: Service
metadata: {name: b, namespace: x}
spec: {clusterIP: 198.18.1.1, ports: [{port: 81}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s, namespace: x, labels: {kubernetes.io/service-name: nothing}}
addressType: IPv4
endpoints: []
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Service, metadata: {name: d, namespace: x}, spec: {clusterIP: 198.18.1.4, selector: {app: d}, ports: [{port: 80}]}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: e, namespace: x}}
`
	_, _, warnings, err := ParseManifests("demo.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range warnings {
		var oe *ObjectError
		if !errors.As(w, &oe) {
			t.Fatalf("%v: not an ObjectError", w)
		}
		got = append(got, fmt.Sprintf("%d %s %s", oe.Document, oe.Object(), oe.Field))
	}
	want := []string{
		"1 Service x/a spec.selector",
		"2 ConfigMap x/c ",
		"3 Service x/b spec.clusterIP",
		"4 EndpointSlice x/s metadata.labels",
		"5 Service x/d items[0].spec.selector",
		"5 ConfigMap x/e items[1]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("warnings in this order:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// lbService is a LoadBalancer Service named name with
// externalTrafficPolicy: Local, its health check on node port hc and its
// port 80 on node port np.
func lbService(name string, hc, np int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: %d
  ports: [{port: 80, nodePort: %d}]
`, name, hc, np)
}
