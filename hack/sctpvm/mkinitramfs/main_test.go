package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestParseModinfo(t *testing.T) {
	data := []byte("license=GPL\x00depends=udp_tunnel,ip6_udp_tunnel,libcrc32c\x00" +
		"softdep=pre: crc32c\x00alias=net-pf-10-proto-132\x00alias=net-pf-2-proto-132\x00" +
		"intree=Y\x00name=sctp\x00vermagic=6.1.0 SMP mod_unload\x00\x00\x00")
	got := parseModinfo(data)
	want := modinfo{
		depends: []string{"udp_tunnel", "ip6_udp_tunnel", "libcrc32c"},
		softPre: []string{"crc32c"},
		aliases: []string{"net-pf-10-proto-132", "net-pf-2-proto-132"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseModinfo:\n got %+v\nwant %+v", got, want)
	}
	if got := parseModinfo([]byte("depends=\x00")); len(got.depends) != 0 {
		t.Fatalf("empty depends= gave %q", got.depends)
	}
}

func TestParseSoftdep(t *testing.T) {
	for _, tc := range []struct {
		in        string
		pre, post []string
	}{
		{"pre: crc32c", []string{"crc32c"}, nil},
		{"pre: a b post: c", []string{"a", "b"}, []string{"c"}},
		{"post: c pre: a", []string{"a"}, []string{"c"}},
		{"stray pre: a", []string{"a"}, nil},
		{"", nil, nil},
	} {
		t.Run(tc.in, func(t *testing.T) {
			pre, post := parseSoftdep(tc.in)
			if !reflect.DeepEqual(pre, tc.pre) || !reflect.DeepEqual(post, tc.post) {
				t.Fatalf("got pre %q post %q, want pre %q post %q", pre, post, tc.pre, tc.post)
			}
		})
	}
}

func TestParseBuiltinModinfo(t *testing.T) {
	data := []byte("crc32c_generic.alias=crypto-crc32c\x00crc32c_generic.alias=crc32c\x00" +
		"crc32c_generic.license=GPL\x00amd-uncore.license=GPL\x00ext4.softdep=pre: crypto-crc32c\x00")
	names, aliases := parseBuiltinModinfo(data)
	for _, n := range []string{"crc32c_generic", "amd_uncore", "ext4"} {
		if !names[n] {
			t.Errorf("%s not built in; names %v", n, names)
		}
	}
	want := []alias{{"crypto-crc32c", "crc32c_generic"}, {"crc32c", "crc32c_generic"}}
	if !reflect.DeepEqual(aliases, want) {
		t.Fatalf("aliases: got %v want %v", aliases, want)
	}
}

func TestModuleFileName(t *testing.T) {
	for _, tc := range []struct {
		base             string
		name             string
		compressed, isKO bool
	}{
		{"sctp.ko", "sctp", false, true},
		{"ip6-udp-tunnel.ko", "ip6_udp_tunnel", false, true},
		{"sctp.ko.zst", "sctp", true, true},
		{"sctp.ko.xz", "sctp", true, true},
		{"modules.order", "", false, false},
	} {
		name, compressed, ok := moduleFileName(tc.base)
		if name != tc.name || compressed != tc.compressed || ok != tc.isKO {
			t.Errorf("moduleFileName(%q) = %q, %v, %v", tc.base, name, compressed, ok)
		}
	}
}

// fakeIndex builds an index over modules described in memory.
func fakeIndex(mods map[string]modinfo, builtin []string, builtinAliases []alias) *moduleIndex {
	ix := &moduleIndex{
		files:          map[string]string{},
		compressed:     map[string]string{},
		builtin:        map[string]bool{},
		builtinAliases: builtinAliases,
		infos:          map[string]modinfo{},
	}
	for n := range mods {
		ix.files[n] = "/m/" + n + ".ko"
	}
	for _, b := range builtin {
		ix.builtin[b] = true
	}
	ix.read = func(file string) (modinfo, error) {
		n := strings.TrimSuffix(filepath.Base(file), ".ko")
		mi, ok := mods[n]
		if !ok {
			return modinfo{}, fmt.Errorf("no file %s", file)
		}
		return mi, nil
	}
	return ix
}

func TestClosure(t *testing.T) {
	// Shaped like Debian 6.1: the cloud kernel builds crc32c in, the
	// generic one has it as crc32c_generic (and crc32c_intel) modules.
	common := map[string]modinfo{
		"sctp":           {depends: []string{"udp_tunnel", "ip6_udp_tunnel", "libcrc32c"}},
		"udp_tunnel":     {},
		"ip6_udp_tunnel": {},
		"libcrc32c":      {softPre: []string{"crc32c"}},
		"dummy":          {aliases: []string{"rtnl-link-dummy"}},
	}
	generic := map[string]modinfo{
		"crc32c_intel":   {aliases: []string{"crc32c", "crypto-crc32c"}},
		"crc32c_generic": {aliases: []string{"crc32c", "crypto-crc32c"}},
	}
	for n, mi := range common {
		generic[n] = mi
	}
	for _, tc := range []struct {
		name           string
		mods           map[string]modinfo
		builtin        []string
		builtinAliases []alias
		wants          []string
		order          []string
		err            string
	}{
		{
			name:           "cloud",
			mods:           common,
			builtin:        []string{"crc32c_generic", "ipv6"},
			builtinAliases: []alias{{"crc32c", "crc32c_generic"}, {"net-pf-10", "ipv6"}},
			wants:          []string{"sctp", "dummy"},
			order:          []string{"udp_tunnel", "ip6_udp_tunnel", "libcrc32c", "sctp", "dummy"},
		},
		{
			name:  "generic picks crc32c_generic for the softdep",
			mods:  generic,
			wants: []string{"sctp"},
			order: []string{"udp_tunnel", "ip6_udp_tunnel", "crc32c_generic", "libcrc32c", "sctp"},
		},
		{
			name:    "built-in want loads nothing",
			mods:    common,
			builtin: []string{"ipv6"},
			wants:   []string{"ipv6"},
		},
		{
			name:  "alias and dashes",
			mods:  common,
			wants: []string{"rtnl-link-dummy", "ip6-udp-tunnel", "dummy"},
			order: []string{"dummy", "ip6_udp_tunnel"},
		},
		{
			name:  "missing soft dependency is skipped",
			mods:  common,
			wants: []string{"libcrc32c"},
			order: []string{"libcrc32c"},
		},
		{
			name:  "missing module",
			mods:  common,
			wants: []string{"nosuch"},
			err:   "nosuch: no such module",
		},
		{
			name:  "missing hard dependency",
			mods:  map[string]modinfo{"a": {depends: []string{"b"}}},
			wants: []string{"a"},
			err:   "a depends on b: no such module",
		},
		{
			name: "cycle",
			mods: map[string]modinfo{
				"a": {depends: []string{"b"}},
				"b": {depends: []string{"a"}},
			},
			wants: []string{"a"},
			err:   "cycle: a -> b -> a",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := fakeIndex(tc.mods, tc.builtin, tc.builtinAliases)
			order, err := ix.closure(tc.wants)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(order, tc.order) {
				t.Fatalf("order %q, want %q", order, tc.order)
			}
		})
	}
}

func TestResolveCompressed(t *testing.T) {
	ix := fakeIndex(nil, nil, nil)
	ix.compressed["sctp"] = "/m/sctp.ko.zst"
	_, _, err := ix.resolve("sctp")
	if err == nil || !strings.Contains(err.Error(), "compressed (sctp.ko.zst)") {
		t.Fatalf("err = %v, want a compressed-module error", err)
	}
}

func TestOpenIndexCompressedOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "kernel/net/sctp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kernel/net/sctp/sctp.ko.xz"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := openIndex(dir)
	if err == nil || !strings.Contains(err.Error(), "only compressed modules") {
		t.Fatalf("err = %v, want a compressed-modules error", err)
	}
}

// cpioEntry is one entry read back from a newc archive.
type cpioEntry struct {
	name         string
	mode         uint32
	nlink        uint32
	rmaj, rmin   uint32
	data         string
	headerOffset int
}

// readCPIO parses a newc archive, checking magic and 4-byte alignment.
func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off%4 != 0 {
			t.Fatalf("header at %d is not 4-byte aligned", off)
		}
		if len(b) < off+110 {
			t.Fatalf("truncated header at %d", off)
		}
		h := string(b[off : off+110])
		if h[:6] != "070701" {
			t.Fatalf("bad magic %q at %d", h[:6], off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(h[6+8*i:14+8*i], 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(v)
		}
		e := cpioEntry{mode: field(1), nlink: field(4), rmaj: field(9), rmin: field(10), headerOffset: off}
		size, namesize := int(field(6)), int(field(11))
		nameEnd := off + 110 + namesize
		if b[nameEnd-1] != 0 {
			t.Fatalf("name at %d not NUL-terminated", off)
		}
		e.name = string(b[off+110 : nameEnd-1])
		dataStart := align(nameEnd)
		e.data = string(b[dataStart : dataStart+size])
		off = align(dataStart + size)
		if e.name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, e)
	}
}

func TestCPIORoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	steps := []error{
		w.Dir("/dev", 0o755),
		w.CharDev("/dev/console", 0o600, 5, 1),
		w.Bytes("/lib/modules/6.1.0/kernel/net/sctp/sctp.ko", 0o644, []byte("odd-sized")),
		w.Bytes("/modules.list", 0o644, []byte("/lib/modules/6.1.0/kernel/net/sctp/sctp.ko\n")),
		w.Bytes("/empty", 0o644, nil),
		w.Dir("/lib/modules", 0o755), // already there: no second entry
		w.Close(),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatal(err)
	}
	got := readCPIO(t, buf.Bytes())
	type row struct {
		name  string
		mode  uint32
		nlink uint32
		rdev  string
		data  string
	}
	var rows []row
	for _, e := range got {
		rows = append(rows, row{e.name, e.mode, e.nlink, fmt.Sprintf("%d:%d", e.rmaj, e.rmin), e.data})
	}
	want := []row{
		{"dev", 0o40755, 2, "0:0", ""},
		{"dev/console", 0o20600, 1, "5:1", ""},
		{"lib", 0o40755, 2, "0:0", ""},
		{"lib/modules", 0o40755, 2, "0:0", ""},
		{"lib/modules/6.1.0", 0o40755, 2, "0:0", ""},
		{"lib/modules/6.1.0/kernel", 0o40755, 2, "0:0", ""},
		{"lib/modules/6.1.0/kernel/net", 0o40755, 2, "0:0", ""},
		{"lib/modules/6.1.0/kernel/net/sctp", 0o40755, 2, "0:0", ""},
		{"lib/modules/6.1.0/kernel/net/sctp/sctp.ko", 0o100644, 1, "0:0", "odd-sized"},
		{"modules.list", 0o100644, 1, "0:0", "/lib/modules/6.1.0/kernel/net/sctp/sctp.ko\n"},
		{"empty", 0o100644, 1, "0:0", ""},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("archive:\n got %+v\nwant %+v", rows, want)
	}
	if w.written != int64(buf.Len()) {
		t.Fatalf("written = %d, buffer has %d", w.written, buf.Len())
	}
}

func TestRequireStatic(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{script, empty} {
		if err := requireStatic(p); err != nil {
			t.Errorf("requireStatic(%s) = %v, want nil for a file that is not ELF", filepath.Base(p), err)
		}
	}
	if err := requireStatic(filepath.Join(dir, "missing")); err == nil {
		t.Error("requireStatic(missing) = nil, want an error")
	}
}

// TestRunWritesArchive builds a small archive end to end, without modules.
func TestRunWritesArchive(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := config{
		out:   filepath.Join(dir, "initrd.cpio"),
		init:  write("vminit", "init"),
		tests: []string{write("pkg.test", "test binary")},
		files: []extraFile{{host: write("proxy", "proxy binary"), guest: "/bin/kube-userspace-proxy"}},
	}
	if err := run(cfg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cfg.out)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range readCPIO(t, b) {
		files[e.name] = e.data
	}
	for name, data := range map[string]string{
		"init":                     "init",
		"tests/pkg.test":           "test binary",
		"bin/kube-userspace-proxy": "proxy binary",
		"modules.list":             "",
		"dev/null":                 "",
	} {
		if got, ok := files[name]; !ok || got != data {
			t.Errorf("%s: got %q (present %v), want %q", name, got, ok, data)
		}
	}
	if _, err := os.Stat(cfg.out + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left behind: %v", err)
	}

	cfg.tests = []string{write("notatest", "x")}
	if err := run(cfg); err == nil || !strings.Contains(err.Error(), "must end in .test") {
		t.Errorf("run with a badly named test = %v, want a naming error", err)
	}
}
