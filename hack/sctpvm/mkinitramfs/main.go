// Command mkinitramfs writes the initramfs of the SCTP test VM: an
// uncompressed newc cpio archive holding the PID 1 binary at /init, the
// test binaries under /tests, a closure of kernel modules under
// /lib/modules/RELEASE with their load order in /modules.list, the
// /dev/console and /dev/null nodes, and any extra files.
//
// The module closure comes from each .ko's .modinfo ELF section: depends=
// and the pre: part of softdep=. Names that are not module files are looked
// up in modules.builtin and modules.builtin.modinfo (built in: nothing to
// load), then as aliases, first of built-ins and then of every module. No
// depmod output, modprobe or cpio tool is needed, and nothing runs as root.
// Only plain .ko files are read; compressed modules are an error.
//
// Usage:
//
//	mkinitramfs -o initrd.cpio -init vminit [-moddir K/lib/modules/REL -modules sctp,dummy] \
//	    [-file HOST:GUEST]... TEST.test...
//
// hack/sctpvm/run-vm.sh is the caller.
package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// fileFlag collects -file HOST:GUEST pairs.
type fileFlag []extraFile

type extraFile struct {
	host, guest string
}

func (f *fileFlag) String() string { return fmt.Sprint(*f) }

func (f *fileFlag) Set(v string) error {
	host, guest, ok := strings.Cut(v, ":")
	if !ok || host == "" || !strings.HasPrefix(guest, "/") {
		return fmt.Errorf("want HOST:/GUEST/PATH, got %q", v)
	}
	*f = append(*f, extraFile{host: host, guest: guest})
	return nil
}

// config is what the command line asks for.
type config struct {
	out     string
	init    string
	moddir  string
	modules []string // names or aliases; empty loads none
	files   []extraFile
	tests   []string
}

func main() {
	var cfg config
	var modules string
	var files fileFlag
	flag.StringVar(&cfg.out, "o", "", "output `file` (required)")
	flag.StringVar(&cfg.init, "init", "", "static PID 1 `binary`, stored as /init (required)")
	flag.StringVar(&cfg.moddir, "moddir", "", "kernel module `dir`, lib/modules/RELEASE of an unpacked kernel")
	flag.StringVar(&modules, "modules", "", "comma-separated module `names` or aliases to load in the VM (empty or none: none)")
	flag.Var(&files, "file", "extra file as `HOST:GUEST` (repeatable)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: mkinitramfs -o FILE -init BINARY [flags] TEST.test...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	cfg.files = files
	cfg.tests = flag.Args()
	if modules != "" && modules != "none" {
		for m := range strings.SplitSeq(modules, ",") {
			if m = strings.TrimSpace(m); m != "" {
				cfg.modules = append(cfg.modules, m)
			}
		}
	}
	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "mkinitramfs: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "mkinitramfs: "+format+"\n", args...)
}

func run(cfg config) error {
	if cfg.out == "" || cfg.init == "" {
		return errors.New("-o and -init are required")
	}
	if len(cfg.modules) > 0 && cfg.moddir == "" {
		return errors.New("-modules needs -moddir")
	}
	if err := requireStatic(cfg.init); err != nil {
		return err
	}
	for _, t := range cfg.tests {
		if !strings.HasSuffix(t, ".test") {
			return fmt.Errorf("test binary %s: name must end in .test (vminit runs /tests/*.test)", t)
		}
		if err := requireStatic(t); err != nil {
			return err
		}
	}
	for _, f := range cfg.files {
		if err := requireStatic(f.host); err != nil {
			return err
		}
	}

	var mods []string // host paths, in load order
	if len(cfg.modules) > 0 {
		ix, err := openIndex(cfg.moddir)
		if err != nil {
			return err
		}
		names, err := ix.closure(cfg.modules)
		if err != nil {
			return err
		}
		if len(names) == 0 {
			logf("modules: none to load (all built in)")
		} else {
			logf("modules, in load order: %s", strings.Join(names, " "))
		}
		for _, n := range names {
			mods = append(mods, ix.files[n])
		}
	}

	tmp := cfg.out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	w := newCPIOWriter(f)
	if err := writeArchive(w, cfg, mods); err != nil {
		f.Close()
		return err
	}
	if err := w.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, cfg.out); err != nil {
		return err
	}
	logf("wrote %s: %d entries, %.1f MiB", cfg.out, w.entries, float64(w.written)/(1<<20))
	return nil
}

// writeArchive writes every entry of the initramfs; mods are the host paths
// of the modules to load, in order.
func writeArchive(w *cpioWriter, cfg config, mods []string) error {
	for _, d := range []string{"/dev", "/proc", "/sys", "/tmp", "/run", "/bin", "/tests"} {
		if err := w.Dir(d, 0o755); err != nil {
			return err
		}
	}
	// The kernel opens /dev/console for PID 1's stdio before /init runs,
	// so the node must be in the archive, not only in the later devtmpfs.
	if err := w.CharDev("/dev/console", 0o600, 5, 1); err != nil {
		return err
	}
	if err := w.CharDev("/dev/null", 0o666, 1, 3); err != nil {
		return err
	}
	if err := w.HostFile("/init", cfg.init, 0o755); err != nil {
		return err
	}
	for _, t := range cfg.tests {
		if err := w.HostFile("/tests/"+filepath.Base(t), t, 0o755); err != nil {
			return err
		}
	}
	var list strings.Builder
	release := filepath.Base(filepath.Clean(cfg.moddir))
	for _, m := range mods {
		rel, err := filepath.Rel(cfg.moddir, m)
		if err != nil {
			return err
		}
		guest := path.Join("/lib/modules", release, filepath.ToSlash(rel))
		if err := w.HostFile(guest, m, 0o644); err != nil {
			return err
		}
		fmt.Fprintln(&list, guest)
	}
	if err := w.Bytes("/modules.list", 0o644, []byte(list.String())); err != nil {
		return err
	}
	for _, f := range cfg.files {
		fi, err := os.Stat(f.host)
		if err != nil {
			return err
		}
		if err := w.HostFile(f.guest, f.host, uint32(fi.Mode().Perm())); err != nil {
			return err
		}
	}
	return nil
}

// requireStatic fails if p is a dynamically linked ELF executable: the
// initramfs has no libc or loader, so such a binary would fail with ENOENT.
// Files that are not ELF are fine.
func requireStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil // not ELF, e.g. a script or data
		}
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: build it with CGO_ENABLED=0", p)
		}
	}
	return nil
}

// cpioWriter writes a newc ("070701") cpio archive, the format the kernel
// unpacks into its initial rootfs (Documentation/driver-api/early-userspace/
// buffer-format.rst). Parent directories are added as needed, because the
// kernel does not create them.
type cpioWriter struct {
	w       *bufio.Writer
	ino     uint32
	dirs    map[string]bool
	entries int
	written int64
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), dirs: map[string]bool{"": true}}
}

const (
	modeDir  = 0o040000
	modeReg  = 0o100000
	modeChar = 0o020000
)

// archiveName turns a guest path into the archive's relative form.
func archiveName(p string) string {
	return strings.TrimPrefix(path.Clean("/"+p), "/")
}

func (c *cpioWriter) header(name string, mode uint32, size int64, nlink, rdevMajor, rdevMinor uint32) error {
	if size > 0xffffffff {
		return fmt.Errorf("cpio: %s: %d bytes is too large for newc", name, size)
	}
	c.ino++
	c.entries++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	if _, err := c.w.WriteString(hdr); err != nil {
		return err
	}
	if _, err := c.w.WriteString(name + "\x00"); err != nil {
		return err
	}
	c.written += int64(len(hdr) + len(name) + 1)
	return c.pad()
}

// pad aligns the archive to 4 bytes.
func (c *cpioWriter) pad() error {
	n := (4 - c.written%4) % 4
	if n == 0 {
		return nil
	}
	c.written += n
	_, err := c.w.Write(make([]byte, n))
	return err
}

func (c *cpioWriter) parents(name string) error {
	dir := path.Dir(name)
	if dir == "." || c.dirs[dir] {
		return nil
	}
	return c.Dir(dir, 0o755)
}

// Dir adds directory p and its missing parents.
func (c *cpioWriter) Dir(p string, perm uint32) error {
	name := archiveName(p)
	if c.dirs[name] {
		return nil
	}
	if err := c.parents(name); err != nil {
		return err
	}
	c.dirs[name] = true
	return c.header(name, modeDir|perm, 0, 2, 0, 0)
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(p string, perm, major, minor uint32) error {
	name := archiveName(p)
	if err := c.parents(name); err != nil {
		return err
	}
	return c.header(name, modeChar|perm, 0, 1, major, minor)
}

// File adds a regular file of size bytes read from r.
func (c *cpioWriter) File(p string, perm uint32, size int64, r io.Reader) error {
	name := archiveName(p)
	if err := c.parents(name); err != nil {
		return err
	}
	if err := c.header(name, modeReg|perm, size, 1, 0, 0); err != nil {
		return err
	}
	n, err := io.CopyN(c.w, r, size)
	c.written += n
	if err != nil {
		return fmt.Errorf("cpio: %s: %w", name, err)
	}
	return c.pad()
}

// Bytes adds a regular file holding b.
func (c *cpioWriter) Bytes(p string, perm uint32, b []byte) error {
	return c.File(p, perm, int64(len(b)), bytes.NewReader(b))
}

// HostFile adds the host file src as p.
func (c *cpioWriter) HostFile(p, src string, perm uint32) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", src)
	}
	return c.File(p, perm, fi.Size(), f)
}

// Close writes the trailer and flushes; it does not close the underlying writer.
func (c *cpioWriter) Close() error {
	if err := c.header("TRAILER!!!", 0, 0, 1, 0, 0); err != nil {
		return err
	}
	return c.w.Flush()
}

// modinfo is what the resolver needs from a module's .modinfo section.
type modinfo struct {
	depends []string // hard dependencies, by module name
	softPre []string // softdep pre: names or aliases, loaded first if found
	aliases []string // patterns this module answers to
}

// parseModinfo parses a .modinfo section: NUL-separated key=value strings.
func parseModinfo(data []byte) modinfo {
	var mi modinfo
	for entry := range bytes.SplitSeq(data, []byte{0}) {
		key, value, ok := strings.Cut(string(entry), "=")
		if !ok {
			continue
		}
		switch key {
		case "depends":
			for d := range strings.SplitSeq(value, ",") {
				if d = strings.TrimSpace(d); d != "" {
					mi.depends = append(mi.depends, d)
				}
			}
		case "softdep":
			pre, _ := parseSoftdep(value)
			mi.softPre = append(mi.softPre, pre...)
		case "alias":
			mi.aliases = append(mi.aliases, value)
		}
	}
	return mi
}

// parseSoftdep splits a softdep value such as "pre: crc32c post: foo bar"
// into its pre and post names (modprobe.d(5)).
func parseSoftdep(v string) (pre, post []string) {
	var cur *[]string
	for _, f := range strings.Fields(v) {
		switch f {
		case "pre:":
			cur = &pre
		case "post:":
			cur = &post
		default:
			if cur != nil {
				*cur = append(*cur, f)
			}
		}
	}
	return pre, post
}

// parseBuiltinModinfo parses modules.builtin.modinfo, NUL-separated
// "module.key=value" strings, into the built-in module names and the
// alias patterns they answer to (alias pattern -> module).
func parseBuiltinModinfo(data []byte) (names map[string]bool, aliases []alias) {
	names = map[string]bool{}
	for entry := range bytes.SplitSeq(data, []byte{0}) {
		key, value, ok := strings.Cut(string(entry), "=")
		if !ok {
			continue
		}
		mod, field, ok := strings.Cut(key, ".")
		if !ok {
			continue
		}
		mod = modName(mod)
		names[mod] = true
		if field == "alias" {
			aliases = append(aliases, alias{pattern: value, module: mod})
		}
	}
	return names, aliases
}

// modName normalizes a module name: the kernel treats - and _ alike.
func modName(s string) string {
	return strings.ReplaceAll(s, "-", "_")
}

// moduleFileName gives the module name of a file name such as
// "amd-uncore.ko", and whether it is a plain .ko or a compressed one.
func moduleFileName(base string) (name string, compressed, ok bool) {
	if n, found := strings.CutSuffix(base, ".ko"); found {
		return modName(n), false, true
	}
	for _, ext := range []string{".ko.xz", ".ko.zst", ".ko.gz"} {
		if n, found := strings.CutSuffix(base, ext); found {
			return modName(n), true, true
		}
	}
	return "", false, false
}

type alias struct {
	pattern, module string
}

func (a alias) matches(name string) bool {
	if a.pattern == name {
		return true
	}
	ok, err := path.Match(a.pattern, name)
	return err == nil && ok
}

// moduleIndex knows the modules of one kernel.
type moduleIndex struct {
	files          map[string]string // module name -> host path of its plain .ko
	compressed     map[string]string // module name -> host path of a .ko.xz/.zst/.gz
	builtin        map[string]bool
	builtinAliases []alias
	// read returns the modinfo of a module file; a field so tests can fake it.
	read  func(file string) (modinfo, error)
	infos map[string]modinfo // cache, by module name
	// aliases of all module files, filled on the first alias lookup that
	// the built-ins do not answer.
	aliases []alias
	scanned bool
}

// openIndex indexes moddir (lib/modules/RELEASE of an unpacked kernel).
func openIndex(moddir string) (*moduleIndex, error) {
	ix := &moduleIndex{
		files:      map[string]string{},
		compressed: map[string]string{},
		builtin:    map[string]bool{},
		read:       readModinfo,
		infos:      map[string]modinfo{},
	}
	err := filepath.WalkDir(moddir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name, compressed, ok := moduleFileName(d.Name())
		if !ok {
			return nil
		}
		m := ix.files
		if compressed {
			m = ix.compressed
		}
		if _, dup := m[name]; !dup {
			m[name] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index modules: %w", err)
	}
	if len(ix.files) == 0 && len(ix.compressed) > 0 {
		return nil, fmt.Errorf("%s has only compressed modules (%d .ko.xz/.zst/.gz files): mkinitramfs reads only plain .ko", moddir, len(ix.compressed))
	}
	if b, err := os.ReadFile(filepath.Join(moddir, "modules.builtin")); err == nil {
		for line := range strings.Lines(string(b)) {
			if name, _, ok := moduleFileName(path.Base(strings.TrimSpace(line))); ok {
				ix.builtin[name] = true
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(moddir, "modules.builtin.modinfo")); err == nil {
		names, aliases := parseBuiltinModinfo(b)
		for n := range names {
			ix.builtin[n] = true
		}
		ix.builtinAliases = aliases
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return ix, nil
}

// readModinfo reads the .modinfo section of a plain .ko file.
func readModinfo(file string) (modinfo, error) {
	f, err := elf.Open(file)
	if err != nil {
		return modinfo{}, fmt.Errorf("read %s: %w", file, err)
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return modinfo{}, fmt.Errorf("read %s: no .modinfo section", file)
	}
	data, err := s.Data()
	if err != nil {
		return modinfo{}, fmt.Errorf("read %s: .modinfo: %w", file, err)
	}
	return parseModinfo(data), nil
}

func (ix *moduleIndex) info(name string) (modinfo, error) {
	if mi, ok := ix.infos[name]; ok {
		return mi, nil
	}
	mi, err := ix.read(ix.files[name])
	if err != nil {
		return modinfo{}, err
	}
	ix.infos[name] = mi
	return mi, nil
}

var errNoModule = errors.New("no such module, built-in or alias")

// resolve maps a module name or alias to a module file name. builtin is
// true when the kernel already has it and nothing needs loading.
func (ix *moduleIndex) resolve(want string) (name string, builtin bool, err error) {
	n := modName(want)
	if _, ok := ix.files[n]; ok {
		return n, false, nil
	}
	if f, ok := ix.compressed[n]; ok {
		return "", false, fmt.Errorf("module %s is compressed (%s): mkinitramfs reads only plain .ko", n, filepath.Base(f))
	}
	if ix.builtin[n] {
		return n, true, nil
	}
	for _, a := range ix.builtinAliases {
		if a.matches(want) {
			return a.module, true, nil
		}
	}
	if !ix.scanned {
		if err := ix.scanAliases(); err != nil {
			return "", false, err
		}
	}
	// Aliases are sorted by module name, so the choice is stable
	// (crc32c_generic before crc32c_intel for "crc32c").
	for _, a := range ix.aliases {
		if a.matches(want) {
			return a.module, false, nil
		}
	}
	return "", false, fmt.Errorf("%s: %w", want, errNoModule)
}

// scanAliases reads the aliases of every module file.
func (ix *moduleIndex) scanAliases() error {
	names := make([]string, 0, len(ix.files))
	for n := range ix.files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		mi, err := ix.info(n)
		if err != nil {
			return err
		}
		for _, p := range mi.aliases {
			ix.aliases = append(ix.aliases, alias{pattern: p, module: n})
		}
	}
	ix.scanned = true
	return nil
}

// closure returns the modules to load for wants, dependencies first.
// Wanted names that are built in are reported and left out.
func (ix *moduleIndex) closure(wants []string) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var order []string
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("module dependency cycle: %s -> %s", strings.Join(chain, " -> "), name)
		}
		state[name] = visiting
		chain = append(chain, name)
		mi, err := ix.info(name)
		if err != nil {
			return err
		}
		// softdep pre: is what modprobe loads first; like modprobe, a
		// missing soft dependency is not an error.
		for _, s := range mi.softPre {
			dep, builtin, err := ix.resolve(s)
			if err != nil {
				if errors.Is(err, errNoModule) {
					logf("%s: soft dependency %s not found, skipped", name, s)
					continue
				}
				return err
			}
			if builtin {
				continue
			}
			if err := visit(dep, chain); err != nil {
				return err
			}
		}
		for _, d := range mi.depends {
			dep, builtin, err := ix.resolve(d)
			if err != nil {
				return fmt.Errorf("%s depends on %w", name, err)
			}
			if builtin {
				continue
			}
			if err := visit(dep, chain); err != nil {
				return err
			}
		}
		state[name] = done
		order = append(order, name)
		return nil
	}
	for _, w := range wants {
		name, builtin, err := ix.resolve(w)
		if err != nil {
			return nil, err
		}
		if builtin {
			logf("%s is built into the kernel (%s): nothing to load", w, name)
			continue
		}
		if err := visit(name, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
