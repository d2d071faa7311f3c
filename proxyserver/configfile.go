package proxyserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// ModeUserspace is the KubeProxyConfiguration mode this proxy runs.
const ModeUserspace = "userspace"

// configFileFields maps the flags a KubeProxyConfiguration file sets
// instead when --config is given (kube-proxy ignores them then too) to the
// file's fields, for messages. --hostname-override is not one: as in
// kube-proxy, the flag wins.
var configFileFields = map[string]string{
	"kubeconfig":                   "clientConnection.kubeconfig",
	"kube-api-qps":                 "clientConnection.qps",
	"kube-api-burst":               "clientConnection.burst",
	"kube-api-content-type":        "clientConnection.contentType",
	"config-sync-period":           "configSyncPeriod",
	"bind-address":                 "bindAddress",
	"healthz-bind-address":         "healthzBindAddress",
	"metrics-bind-address":         "metricsBindAddress",
	"nodeport-addresses":           "nodePortAddresses",
	"cluster-cidr":                 "clusterCIDR",
	"iptables-sync-period":         "iptables.syncPeriod",
	"iptables-min-sync-period":     "iptables.minSyncPeriod",
	"iptables-localhost-nodeports": "iptables.localhostNodePorts",
	"proxy-port-range":             "portRange",
	"udp-timeout":                  "udpIdleTimeout",
	"hostname-override":            "hostnameOverride",
	"bind-address-hard-fail":       "bindAddressHardFail",
}

// overriddenModeFlags are kube-proxy's flags that the --config file's
// mode and detectLocalMode replace; they are checked only without it.
var overriddenModeFlags = []string{"proxy-mode", "detect-local-mode"}

// LoadConfigFile reads the KubeProxyConfiguration file of --config, if
// one is given, into c: what a kube-proxy DaemonSet's ConfigMap holds,
// with mode userspace (or no mode). fs is the parsed command line: flags
// the file stands for are ignored, and said to be; --hostname-override
// and -v given on the command line win over the file, as in kube-proxy.
// The file's fields that mean nothing to a userspace proxy are ignored,
// and the ones set are named in the log.
//
// It is kube-proxy's Complete: without a file too, it applies what
// kube-proxy applies to the options before it validates them, which
// Validate does not: the deprecated --healthz-port and --metrics-port
// (applyDeprecatedPortFlags), and a host name trimmed and lower-cased.
func (c *Config) LoadConfigFile(fs *pflag.FlagSet) error {
	if f := fs.Lookup("vmodule"); f != nil && f.Changed {
		c.LogVModule = f.Value.String() // shown in /configz and written by --write-config-to
	}
	if err := c.applyDeprecatedPortFlags(); err != nil {
		return err
	}
	if err := c.readConfigFile(fs); err != nil {
		return err
	}
	// As kube-proxy stores it (processHostnameOverrideFlag): what
	// /configz shows and --write-config-to writes is the node name. A
	// blank one is left for Validate to refuse, naming it.
	if h := strings.TrimSpace(c.HostnameOverride); h != "" {
		c.HostnameOverride = strings.ToLower(h)
	}
	return nil
}

// readConfigFile is LoadConfigFile's reading of the --config file.
func (c *Config) readConfigFile(fs *pflag.FlagSet) error {
	if c.ConfigFile == "" {
		return nil
	}
	data, err := readOptionsFile(c.ConfigFile)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	kp, udpIdle, err := decodeKubeProxyConfig(data)
	if err != nil {
		return fmt.Errorf("--config %s: %w", c.ConfigFile, err)
	}
	c.fileData = data
	c.fromFile = make(map[string]bool)
	var ignored []string
	for name := range configFileFields {
		if name == "udp-timeout" || name == "hostname-override" { // these flags win over the file
			continue
		}
		c.fromFile[name] = true
		if f := fs.Lookup(name); f != nil && f.Changed {
			ignored = append(ignored, "--"+name)
		}
	}
	// kube-proxy replaces these too with the file's mode and
	// detectLocalMode: a DaemonSet's --proxy-mode=iptables beside a file
	// with mode: userspace is not checked, only said to be overridden.
	for _, name := range overriddenModeFlags {
		if fs.Changed(name) {
			ignored = append(ignored, "--"+name)
		}
	}
	slices.Sort(ignored)
	if len(ignored) > 0 {
		klog.InfoS("Flags ignored: the --config file sets these instead, as in kube-proxy", "flags", ignored, "config", c.ConfigFile)
	}
	// As kube-proxy: only a non-empty --hostname-override wins over the
	// file (an empty one, as a template may leave, is no override).
	if err := c.fromKubeProxyConfig(kp, fs.Changed("hostname-override") && c.HostnameOverride != ""); err != nil {
		return fmt.Errorf("--config %s: %w", c.ConfigFile, err)
	}
	if udpIdle != 0 && !fs.Changed("udp-timeout") {
		c.UDPIdleTimeout = udpIdle
		c.fromFile["udp-timeout"] = true
	}
	if !fs.Changed("v") && kp.Logging.Verbosity != 0 {
		v := int(kp.Logging.Verbosity)
		c.LogVerbosity = &v
	}
	if !fs.Changed("vmodule") {
		vmodule, err := vmoduleFlag(kp.Logging.VModule)
		if err != nil {
			return fmt.Errorf("--config %s: %w", c.ConfigFile, err)
		}
		c.LogVModule = vmodule
	}
	if names := inapplicable(kp); len(names) > 0 {
		klog.InfoS("Settings of the --config file that a userspace proxy has no use for are ignored", "fields", names)
	}
	return nil
}

// vmoduleFlag writes a file's logging.vmodule as klog's --vmodule value
// (pattern=N,pattern=N), as kube-proxy applies it; "" when empty.
func vmoduleFlag(items logsapi.VModuleConfiguration) (string, error) {
	var parts []string
	for i, it := range items {
		if it.FilePattern == "" || strings.ContainsAny(it.FilePattern, ",=") {
			return "", fmt.Errorf("logging.vmodule[%d].filePattern: %q must be a file name pattern, not empty and without ',' or '='", i, it.FilePattern)
		}
		parts = append(parts, fmt.Sprintf("%s=%d", it.FilePattern, it.Verbosity))
	}
	return strings.Join(parts, ","), nil
}

// decodeMessage is err's message without the JSON decoder's prefixes,
// which say nothing to someone who wrote YAML.
func decodeMessage(err error) string {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return msg
}

// badField finds the first value under v (the file's fields, at path)
// that a KubeProxyConfiguration cannot take, by decoding each value alone:
// the decoder's own errors do not say which field they are about. It
// returns the value's path (iptables.syncPeriod, nodePortAddresses), the
// value and the error, or "".
func badField(v any, path []string) (string, any, error) {
	switch t := v.(type) {
	case map[string]any:
		if ft := fieldType(reflect.TypeFor[kubeproxyv1alpha1.KubeProxyConfiguration](), path); ft != nil && !holdsFields(ft) {
			break // a map where a plain value belongs: the value is bad
		}
		for _, k := range slices.Sorted(maps.Keys(t)) {
			if p, bad, err := badField(t[k], append(slices.Clone(path), k)); p != "" {
				return p, bad, err
			}
		}
		return "", nil, nil
	case []any:
		// A list is decoded whole: a bad item fails it alone.
	}
	doc := v
	for i := len(path) - 1; i >= 0; i-- {
		doc = map[string]any{path[i]: doc}
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		return "", nil, nil
	}
	var kp kubeproxyv1alpha1.KubeProxyConfiguration
	if err := yaml.Unmarshal(data, &kp); err != nil {
		return strings.Join(path, "."), v, err
	}
	return "", nil, nil
}

// typeMismatch matches the JSON decoder's report of a value of the wrong
// type, which speaks of Go: "cannot unmarshal number into Go struct field
// KubeProxyIPTablesConfiguration.iptables.syncPeriod of type string".
var typeMismatch = regexp.MustCompile(`cannot unmarshal (\w+)(?: \S+)? into Go struct field \S+ of type (\S+)`)

// describeBadValue says why value, at path in a KubeProxyConfiguration,
// was refused (err): for a value of the wrong type, in the words of
// someone who wrote the file ("30 is a number; want a duration such as
// 30s"), else err's message.
func describeBadValue(path string, value any, err error) string {
	msg := decodeMessage(err)
	m := typeMismatch.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	got := map[string]string{"number": "a number", "string": "a string", "bool": "true or false",
		"array": "a list", "object": "a map"}[m[1]]
	if got == "" {
		return msg
	}
	want := wantOf(fieldType(reflect.TypeFor[kubeproxyv1alpha1.KubeProxyConfiguration](), strings.Split(path, ".")), m[2])
	switch v := value.(type) {
	case string:
		return fmt.Sprintf("%q is %s; want %s", v, got, want)
	case map[string]any, []any, nil:
		return fmt.Sprintf("is %s; want %s", got, want)
	default:
		return fmt.Sprintf("%v is %s; want %s", v, got, want)
	}
}

// holdsFields reports whether a value of type t is written as a map: a
// struct other than metav1.Duration (a string), or a map.
func holdsFields(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Map || t.Kind() == reflect.Struct && t.Name() != "Duration"
}

// fieldType is the type of the field at path (JSON names) under t, or nil.
func fieldType(t reflect.Type, path []string) reflect.Type {
	for _, name := range path {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		next, ok := jsonFields(t)[name]
		if !ok {
			return nil
		}
		t = next
	}
	return t
}

// wantOf says what a field of type t takes, in a YAML writer's words;
// goType is the decoder's name for it, used when t is nil.
func wantOf(t reflect.Type, goType string) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != nil && t.Kind() == reflect.Struct && t.Name() == "Duration" {
		return "a duration such as 30s or 15m"
	}
	kind := reflect.Invalid
	if t != nil {
		kind = t.Kind()
	}
	switch {
	case kind == reflect.Bool || goType == "bool":
		return "true or false"
	case kind >= reflect.Int && kind <= reflect.Uint64 || strings.Contains(goType, "int"):
		return "a whole number"
	case kind == reflect.Float32 || kind == reflect.Float64 || strings.HasPrefix(goType, "float"):
		return "a number"
	case kind == reflect.Slice || strings.HasPrefix(goType, "[]"):
		return "a list"
	case kind == reflect.Struct || kind == reflect.Map:
		return "a map of fields"
	}
	return "a string"
}

// duplicateKey matches the YAML decoder's report of a key given twice.
var duplicateKey = regexp.MustCompile(`line (\d+): key "([^"]*)" already set in map`)

// duplicateKeys names the keys data (YAML or JSON) gives twice in one
// object, as "line N: key", in the order of the lines; nil if none.
func duplicateKeys(data []byte) []string {
	_, err := yaml.YAMLToJSONStrict(data)
	if err == nil {
		return nil
	}
	var out []string
	for _, m := range duplicateKey.FindAllStringSubmatch(err.Error(), -1) {
		out = append(out, "line "+m[1]+": "+m[2])
	}
	return out
}

// decodeKubeProxyConfig reads a KubeProxyConfiguration (YAML or JSON) as
// kube-proxy does: strictly, and if only strictness fails (an unknown or
// repeated field, perhaps from a newer kube-proxy, or a kubeadm template's
// mode: "" with a mode added below it), leniently with a warning that
// names the fields; of a repeated field, the last value wins. It also
// returns the legacy userspace mode's udpIdleTimeout, which the type no
// longer has (0 if absent).
func decodeKubeProxyConfig(data []byte) (*kubeproxyv1alpha1.KubeProxyConfiguration, time.Duration, error) {
	var fields map[string]any
	if err := yaml.Unmarshal(data, &fields); err != nil {
		return nil, 0, err
	}
	// Before udpIdleTimeout is taken out below, which writes the fields
	// again, once each.
	if dups := duplicateKeys(data); len(dups) > 0 {
		klog.InfoS("Using lenient decoding as strict decoding failed: the --config file sets a field more than once; the last value is used, as in kube-proxy", "duplicates", dups)
	}
	var udpIdle time.Duration
	if v, ok := fields["udpIdleTimeout"]; ok {
		s, _ := v.(string)
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, 0, fmt.Errorf("udpIdleTimeout: %v is not a positive duration such as 250ms", v)
		}
		udpIdle = d
		delete(fields, "udpIdleTimeout")
		if data, err = yaml.Marshal(fields); err != nil {
			return nil, 0, err
		}
	}
	var kp kubeproxyv1alpha1.KubeProxyConfiguration
	if strictErr := yaml.UnmarshalStrict(data, &kp); strictErr != nil {
		// Strict decoding stops at the first repeated field (said
		// above) before it looks for unknown ones: those are found here.
		kp = kubeproxyv1alpha1.KubeProxyConfiguration{}
		if err := yaml.Unmarshal(data, &kp); err != nil {
			if path, value, ferr := badField(fields, nil); path != "" {
				return nil, 0, fmt.Errorf("%s: %s", path, describeBadValue(path, value, ferr))
			}
			return nil, 0, errors.New(decodeMessage(err))
		}
		if unknown := unknownFields(fields, reflect.TypeOf(kp), ""); len(unknown) > 0 {
			klog.InfoS("The --config file has fields this proxy does not know (perhaps a newer kube-proxy's, or misspelt); they are ignored", "fields", unknown)
		} else if !duplicateKey.MatchString(strictErr.Error()) {
			klog.InfoS("The --config file has a field this proxy does not know, maybe more; they are ignored", "first", decodeMessage(strictErr))
		}
	}
	if kp.APIVersion != kubeProxyAPIVersion || kp.Kind != "KubeProxyConfiguration" {
		return nil, 0, fmt.Errorf("apiVersion %q, kind %q: want apiVersion %s, kind KubeProxyConfiguration", kp.APIVersion, kp.Kind, kubeProxyAPIVersion)
	}
	return &kp, udpIdle, nil
}

// fromKubeProxyConfig sets c from kp, with kube-proxy's defaults for what
// kp leaves out. keepHostname says --hostname-override was given.
func (c *Config) fromKubeProxyConfig(kp *kubeproxyv1alpha1.KubeProxyConfiguration, keepHostname bool) error {
	var errs []error
	if err := checkMode("mode", string(kp.Mode)); err != nil {
		errs = append(errs, err)
	}
	d := NewConfig()
	or := func(s, def string) string {
		if s == "" {
			return def
		}
		return s
	}
	orDuration := func(v, def time.Duration) time.Duration {
		if v == 0 {
			return def
		}
		return v
	}
	cc := kp.ClientConnection
	c.Kubeconfig = cc.Kubeconfig
	c.KubeAPIContentType = or(cc.ContentType, d.KubeAPIContentType)
	c.KubeAPIAcceptContentTypes = cc.AcceptContentTypes
	c.KubeAPIQPS, c.KubeAPIBurst = d.KubeAPIQPS, d.KubeAPIBurst
	if cc.QPS != 0 {
		c.KubeAPIQPS = cc.QPS
	}
	if cc.Burst != 0 {
		c.KubeAPIBurst = int(cc.Burst)
	}
	if !keepHostname {
		c.HostnameOverride = kp.HostnameOverride
		c.fromFile["hostname-override"] = kp.HostnameOverride != ""
	}
	c.BindAddress = or(kp.BindAddress, d.BindAddress)
	healthz, metrics := d.HealthzBindAddress, d.MetricsBindAddress
	if ip, err := netip.ParseAddr(strings.TrimSpace(kp.BindAddress)); err == nil && ip.Is6() {
		// kube-proxy's defaults follow an IPv6 bindAddress.
		healthz, metrics = fmt.Sprintf("[::]:%d", defaultHealthzPort), fmt.Sprintf("[::1]:%d", defaultMetricsPort)
	}
	c.HealthzBindAddress = or(kp.HealthzBindAddress, healthz)
	c.MetricsBindAddress = or(kp.MetricsBindAddress, metrics)
	c.BindAddressHardFail = kp.BindAddressHardFail
	c.SyncPeriod = orDuration(kp.IPTables.SyncPeriod.Duration, d.SyncPeriod)
	c.MinSyncPeriod = orDuration(kp.IPTables.MinSyncPeriod.Duration, d.MinSyncPeriod)
	c.ConfigSyncPeriod = orDuration(kp.ConfigSyncPeriod.Duration, d.ConfigSyncPeriod)
	c.ProxyPortRange = kp.PortRange
	if err := checkDetectLocalMode("detectLocalMode", string(kp.DetectLocalMode)); err != nil {
		errs = append(errs, err)
	}
	// Checked by Validate, which names the field. It tells pod traffic
	// apart whatever detectLocalMode says, as --cluster-cidr does beside
	// --detect-local-mode: the node's pod CIDR or interfaces, which the
	// other modes use, are not supported (see inapplicable), and the
	// cluster's CIDR keeps this node's pods inside, as those modes do,
	// where no CIDR at all would turn their traffic away from a Service
	// with externalTrafficPolicy: Local and no endpoint here.
	c.ClusterCIDR = kp.ClusterCIDR
	c.LocalhostNodePorts = kp.IPTables.LocalhostNodePorts == nil || *kp.IPTables.LocalhostNodePorts
	c.NodePortAddresses = nil
	for _, a := range kp.NodePortAddresses {
		switch a {
		case "all": // kube-proxy's keyword for every address: ours when empty
		case "localhost":
			c.NodePortAddresses = append(c.NodePortAddresses, "127.0.0.0/8", "::1/128")
		default: // CIDRs, or primary (checked by Validate)
			c.NodePortAddresses = append(c.NodePortAddresses, a)
		}
	}
	if slices.Contains(kp.NodePortAddresses, "all") {
		c.NodePortAddresses = nil // every address, whatever else is listed
	}
	return errors.Join(errs...)
}

// inapplicable names the fields of kp that are set but mean nothing to a
// userspace proxy (masquerading, conntrack tuning, other modes' settings).
func inapplicable(kp *kubeproxyv1alpha1.KubeProxyConfiguration) []string {
	var out []string
	add := func(set bool, name string) {
		if set {
			out = append(out, name)
		}
	}
	add(len(kp.FeatureGates) > 0, "featureGates")
	add(kp.EnableProfiling, "enableProfiling")
	add(kp.ShowHiddenMetricsForVersion != "", "showHiddenMetricsForVersion")
	add(kp.IPTables.MasqueradeAll, "iptables.masqueradeAll")
	add(kp.IPTables.MasqueradeBit != nil, "iptables.masqueradeBit")
	add(!reflect.ValueOf(kp.IPVS).IsZero(), "ipvs")
	add(!reflect.ValueOf(kp.NFTables).IsZero(), "nftables")
	add(!reflect.ValueOf(kp.Winkernel).IsZero(), "winkernel")
	add(kp.Logging.Format != "" && kp.Logging.Format != "text", "logging.format (logs are text)")
	add(kp.Logging.FlushFrequency.Duration.Duration != 0 || kp.Logging.FlushFrequency.SerializeAsString, "logging.flushFrequency (logs are not buffered)")
	// kubeadm's config.conf gives infoBufferSize "0" for both formats:
	// the default, as no options at all.
	routed := func(o logsapi.OutputRoutingOptions) bool { return o.SplitStream || !o.InfoBufferSize.IsZero() }
	add(routed(kp.Logging.Options.Text.OutputRoutingOptions) || routed(kp.Logging.Options.JSON.OutputRoutingOptions), "logging.options")
	add(kp.DetectLocalMode != "" && kp.DetectLocalMode != "ClusterCIDR", "detectLocalMode (only ClusterCIDR is supported: clusterCIDR tells pod traffic apart)")
	add(kp.DetectLocal.BridgeInterface != "" || kp.DetectLocal.InterfaceNamePrefix != "", "detectLocal")
	add(kp.OOMScoreAdj != nil, "oomScoreAdj")
	add(kp.Conntrack.MaxPerCore != nil || kp.Conntrack.Min != nil || kp.Conntrack.TCPEstablishedTimeout != nil ||
		kp.Conntrack.TCPCloseWaitTimeout != nil || kp.Conntrack.TCPBeLiberal || kp.Conntrack.UDPTimeout.Duration != 0 ||
		kp.Conntrack.UDPStreamTimeout.Duration != 0, "conntrack")
	add(kp.WindowsRunAsService, "windowsRunAsService")
	slices.Sort(out)
	return slices.Compact(out)
}

// kubeProxyAPIVersion is the KubeProxyConfiguration version read and written.
const kubeProxyAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"

// WriteConfigFile writes to c.WriteConfigTo the KubeProxyConfiguration
// (mode userspace) that stands for c, with verbosity as logging.verbosity:
// what LoadConfigFile reads back as the same options. A value the file
// cannot hold is an error that names it: an empty --healthz-bind-address,
// say, which the file would read as kube-proxy's default address. It
// returns the flags given that the file does not hold (this proxy's own,
// such as --portal), as "--name=value": they must still be given beside
// --config. One given at its default value is left out. c must be valid (see Validate).
func (c *Config) WriteConfigFile(verbosity int) ([]string, error) {
	data, err := c.marshalKubeProxyConfig(verbosity)
	if err != nil {
		return nil, fmt.Errorf("--write-config-to: %w", err)
	}
	if err := c.readsBackAs(data, verbosity); err != nil {
		return nil, fmt.Errorf("--write-config-to: %w", err)
	}
	if err := os.WriteFile(c.WriteConfigTo, data, 0o644); err != nil {
		return nil, fmt.Errorf("--write-config-to: %w", err)
	}
	var keep []string
	c.flagSet().Visit(func(f *pflag.Flag) {
		switch {
		case configFileFields[f.Name] != "", f.Name == "v", f.Name == "vmodule", f.Name == "config", f.Name == "write-config-to", f.Name == "init-only", f.Name == "proxy-mode":
			return // in the file, or about the file
		case isKubeProxyOnly(f.Name):
			return // ignored either way
		case f.Value.String() == f.DefValue:
			return // given as it is by default: nothing to keep
		}
		keep = append(keep, "--"+f.Name+"="+flagValue(f))
	})
	return keep, nil
}

// flagValue is f's value as a command line gives it: a list
// comma-separated, and quoted when empty or when a shell would split it.
func flagValue(f *pflag.Flag) string {
	v := f.Value.String()
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		v = strings.Join(sv.GetSlice(), ",")
	}
	if v == "" || strings.ContainsAny(v, " \t\"'$\\") {
		v = fmt.Sprintf("%q", v)
	}
	return v
}

// flagSet returns the flags bound to c's fields, registering them if
// AddFlags has not.
func (c *Config) flagSet() *pflag.FlagSet {
	if c.flags == nil {
		c.AddFlags(pflag.NewFlagSet("kube-userspace-proxy", pflag.ContinueOnError))
	}
	return c.flags
}

// marshalKubeProxyConfig returns c as a KubeProxyConfiguration file: the
// fields kube-proxy's flags stand for, leaving out those at their zero
// value (which read back as kube-proxy's defaults, as if absent), and the
// legacy userspace mode's udpIdleTimeout.
func (c *Config) marshalKubeProxyConfig(verbosity int) ([]byte, error) {
	kp := c.kubeProxyConfig(verbosity)
	typed, err := yaml.Marshal(&kp)
	if err != nil {
		return nil, err
	}
	var fields map[string]any
	if err := yaml.Unmarshal(typed, &fields); err != nil {
		return nil, err
	}
	pruneZero(fields)
	if !c.LocalhostNodePorts {
		// A false that means something: the field defaults to true.
		ipt, _ := fields["iptables"].(map[string]any)
		if ipt == nil {
			ipt = make(map[string]any)
			fields["iptables"] = ipt
		}
		ipt["localhostNodePorts"] = false
	}
	fields["udpIdleTimeout"] = c.UDPIdleTimeout.String()
	data, err := yaml.Marshal(fields)
	if err != nil {
		return nil, err
	}
	header := "# Written by kube-userspace-proxy --write-config-to; run it with --config and this file.\n"
	return append([]byte(header), data...), nil
}

// kubeProxyConfig returns c as a KubeProxyConfiguration (mode
// userspace), with verbosity as logging.verbosity: the fields kube-proxy's
// flags stand for.
func (c *Config) kubeProxyConfig(verbosity int) kubeproxyv1alpha1.KubeProxyConfiguration {
	kp := kubeproxyv1alpha1.KubeProxyConfiguration{
		Mode:                ModeUserspace,
		HostnameOverride:    c.HostnameOverride,
		BindAddress:         c.BindAddress,
		HealthzBindAddress:  c.HealthzBindAddress,
		MetricsBindAddress:  c.MetricsBindAddress,
		BindAddressHardFail: c.BindAddressHardFail,
		ClusterCIDR:         c.ClusterCIDR,
		PortRange:           c.ProxyPortRange,
		NodePortAddresses:   c.NodePortAddresses,
	}
	kp.APIVersion, kp.Kind = kubeProxyAPIVersion, "KubeProxyConfiguration"
	kp.ClientConnection.Kubeconfig = c.Kubeconfig
	kp.ClientConnection.QPS = c.KubeAPIQPS
	kp.ClientConnection.Burst = int32(c.KubeAPIBurst)
	kp.ClientConnection.ContentType = c.KubeAPIContentType
	kp.ClientConnection.AcceptContentTypes = c.KubeAPIAcceptContentTypes
	kp.ConfigSyncPeriod.Duration = c.ConfigSyncPeriod
	kp.IPTables.SyncPeriod.Duration = c.SyncPeriod
	kp.IPTables.MinSyncPeriod.Duration = c.MinSyncPeriod
	kp.Logging.Verbosity = logsapi.VerbosityLevel(verbosity)
	for _, item := range strings.Split(c.LogVModule, ",") {
		pat, v, _ := strings.Cut(strings.TrimSpace(item), "=")
		if pat == "" {
			continue
		}
		n, _ := strconv.Atoi(v)
		kp.Logging.VModule = append(kp.Logging.VModule, logsapi.VModuleItem{FilePattern: pat, Verbosity: logsapi.VerbosityLevel(n)})
	}
	return kp
}

// configzBody is what /configz answers, as kube-proxy's (component-base
// configz): the effective configuration under its API group's name, here
// as the versioned KubeProxyConfiguration, with kube-proxy's defaults for
// what the options leave out, and, as --write-config-to writes it, the
// legacy userspace mode's udpIdleTimeout (the effective --udp-timeout).
func (c *Config) configzBody(verbosity int) ([]byte, error) {
	kp := c.kubeProxyConfig(verbosity)
	if c.HostnameOverride == "" {
		kp.HostnameOverride = "" // the host name, as kube-proxy leaves it
	}
	kp.FeatureGates = map[string]bool{}
	kp.Logging.Format = "text"
	if kp.NodePortAddresses == nil {
		kp.NodePortAddresses = []string{"all"}
	}
	localhost := c.LocalhostNodePorts
	kp.IPTables.LocalhostNodePorts = &localhost
	typed, err := json.Marshal(kp)
	if err != nil {
		return nil, err
	}
	var fields map[string]any
	if err := json.Unmarshal(typed, &fields); err != nil {
		return nil, err
	}
	fields["udpIdleTimeout"] = c.UDPIdleTimeout.String()
	return json.Marshal(map[string]any{kubeproxyv1alpha1.GroupName: fields})
}

// pruneZero deletes from m, recursively, the values that decode as if
// absent: null, "", false, 0, "0" (a quantity), "0s" and what is left
// empty.
func pruneZero(m map[string]any) {
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			pruneZero(sub)
			if len(sub) == 0 {
				delete(m, k)
			}
			continue
		}
		switch v {
		case nil, "", false, float64(0), "0", "0s":
			delete(m, k)
			continue
		}
		if l, ok := v.([]any); ok && len(l) == 0 {
			delete(m, k)
		}
	}
}

// readsBackAs checks that the file data reads back, as LoadConfigFile
// reads it, as c's options and verbosity, and names each that does not.
func (c *Config) readsBackAs(data []byte, verbosity int) error {
	kp, udpIdle, err := decodeKubeProxyConfig(data)
	if err != nil {
		return err
	}
	back := NewConfig()
	backFlags := back.flagSet()
	back.fromFile = make(map[string]bool)
	if err := back.fromKubeProxyConfig(kp, false); err != nil {
		return err
	}
	if udpIdle != 0 {
		back.UDPIdleTimeout = udpIdle
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(configFileFields)) {
		got, want := flagValue(backFlags.Lookup(name)), flagValue(c.flagSet().Lookup(name))
		if got != want && !samePortRange(name, back.ProxyPortRange, c.ProxyPortRange) {
			errs = append(errs, fmt.Errorf("--%s=%s cannot be written: a KubeProxyConfiguration's %s would read back as %s", name, want, configFileFields[name], got))
		}
	}
	if back.KubeAPIAcceptContentTypes != c.KubeAPIAcceptContentTypes {
		errs = append(errs, fmt.Errorf("clientConnection.acceptContentTypes %q cannot be written: it would read back as %q", c.KubeAPIAcceptContentTypes, back.KubeAPIAcceptContentTypes))
	}
	if vmodule, err := vmoduleFlag(kp.Logging.VModule); err != nil || vmodule != c.LogVModule {
		errs = append(errs, fmt.Errorf("--vmodule=%s cannot be written: logging.vmodule would read back as %s", c.LogVModule, vmodule))
	}
	if int(kp.Logging.Verbosity) != verbosity {
		errs = append(errs, fmt.Errorf("-v=%d cannot be written: logging.verbosity would read back as %d", verbosity, kp.Logging.Verbosity))
	}
	return errors.Join(errs...)
}

// samePortRange reports whether flag name is --proxy-port-range and a and
// b say the same range ("0" and "" both let the kernel choose).
func samePortRange(name, a, b string) bool {
	if name != "proxy-port-range" {
		return false
	}
	ra, erra := userspace.ParsePortRange(a)
	rb, errb := userspace.ParsePortRange(b)
	return erra == nil && errb == nil && ra == rb
}

// unknownFields returns the paths (iptables.syncPeriodd) of the keys in
// fields, a decoded YAML object, that type t (a struct, as encoding/json
// sees it) has no field for, in the order of the keys.
func unknownFields(fields map[string]any, t reflect.Type, path string) []string {
	known := jsonFields(t)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		ft, ok := known[k]
		if !ok {
			out = append(out, path+k)
			continue
		}
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if sub, isMap := fields[k].(map[string]any); isMap && ft.Kind() == reflect.Struct {
			out = append(out, unknownFields(sub, ft, path+k+".")...)
		}
	}
	return out
}

// jsonFields maps the names encoding/json gives the fields of struct type
// t (those of inlined structs among them) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	known := make(map[string]reflect.Type)
	var collect func(t reflect.Type)
	collect = func(t reflect.Type) {
		for f := range t.Fields() {
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-" || !f.IsExported() && !f.Anonymous:
			case name == "" && (f.Anonymous || strings.Contains(opts, "inline")) && f.Type.Kind() == reflect.Struct:
				collect(f.Type)
			case name == "":
				known[f.Name] = f.Type
			default:
				known[name] = f.Type
			}
		}
	}
	collect(t)
	return known
}
