//go:build linux

package cabi

import (
	"bytes"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSettingsInTheFile: every setting softefa run offers goes into the program's file under its
// flag's name and comes back from it, and docs/settings.md lists its flag and the file's every
// key; every key the shim reads is one the file has.
func TestSettingsInTheFile(t *testing.T) {
	doc, err := os.ReadFile("../docs/settings.md")
	if err != nil {
		t.Fatal(err)
	}
	full := fullConf()
	for v, i := reflect.ValueOf(full), 0; i < v.NumField(); i++ {
		if v.Field(i).IsZero() {
			t.Errorf("fullConf leaves %s unset", v.Type().Field(i).Name)
		}
	}
	text, err := full.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(text)), "\n") {
		key, _, _ := strings.Cut(line, "=")
		keys[key] = true
		if !strings.Contains(string(doc), "| `"+key+"` |") {
			t.Errorf("docs/settings.md's table of the program's file does not list %s", key)
		}
	}
	for _, s := range Settings {
		if !keys[s.Flag] {
			t.Errorf("--%s is not in the program's file", s.Flag)
		}
		var c Conf
		v := "250us"
		if s.Bool {
			v = "true"
		}
		if err := c.Set(s.Flag, v); err != nil || reflect.DeepEqual(c, Conf{}) {
			t.Errorf("--%s %s: %v, the file's fields unchanged", s.Flag, v, err)
		}
		if !strings.Contains(string(doc), "`--"+s.Flag+"`") {
			t.Errorf("docs/settings.md does not list --%s", s.Flag)
		}
	}
	files, _ := filepath.Glob("shim/*.c")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`softefa_conf\("([^"]*)"\)`).FindAllStringSubmatch(string(b), -1) {
			if !keys[m[1]] {
				t.Errorf("%s reads %q, which the program's file never has", f, m[1])
			}
		}
	}
	if got := shimKeys(t); !reflect.DeepEqual(got, keys) {
		t.Errorf("the shim knows the keys %v; the file has %v", got, keys)
	}
}

// shimKeys are the keys the shim's reader of the program's file knows (conf.c's known).
func shimKeys(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("shim/conf.c")
	if err != nil {
		t.Fatal(err)
	}
	list := regexp.MustCompile(`(?s)known\[\] = \{(.*?)\};`).FindSubmatch(b)
	if list == nil {
		t.Fatal("conf.c: no list of known keys")
	}
	keys := map[string]bool{}
	for _, m := range regexp.MustCompile(`"([^"]+)"`).FindAllSubmatch(list[1], -1) {
		keys[string(m[1])] = true
	}
	return keys
}

// TestShimReadsTheFileAsConfDoes runs the shim's reader (conf.c, in testdata/confread.c) on
// files cabi.Conf takes and on files it refuses for their lines: the shim has the same value for
// every key, or, for a file refused, none and a message.
func TestShimReadsTheFileAsConfDoes(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skipf("cc not found: %v", err)
	}
	exe := filepath.Join(t.TempDir(), "confread")
	if out, err := exec.Command("cc", "-O2", "-Wall", "-Werror", "-o", exe, "testdata/confread.c", "shim/conf.c",
		"-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	full, _ := fullConf().MarshalText()
	many := strings.Repeat("name=a\n", confLines)
	for _, c := range []struct{ name, text string }{
		{"written by Conf", string(full)},
		{"empty", ""},
		{"empty lines, a key twice, no last newline", "\nname=a\n\nname=b=c\ndebug=1"},
		{"64 lines", many},
		{"65 lines", many + "name=b\n"},
		{"no =", "name=a\ndebug\n"},
		{"unknown key", "name=a\ncolour=blue\n"},
		{"empty key", "=a\n"},
		{"NUL", "name=a\x00\ndebug=1\n"},
		{"CR", "name=a\r\nengine=/x\r\n"},
		{"empty values", "name=\nsysfs-root=\nengine=/x\nengine=\n"},
		{"16,383 bytes", "name=" + strings.Repeat("n", confBytes-5)},
		{"16,384 bytes", "name=" + strings.Repeat("n", confBytes-4)},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), ConfFile)
			if err := os.WriteFile(path, []byte(c.text), 0o600); err != nil {
				t.Fatal(err)
			}
			var conf Conf
			goErr := conf.UnmarshalText([]byte(c.text))
			want := map[string]string{} // key: the value of its last line, unless empty
			if goErr == nil {
				for _, line := range strings.Split(c.text, "\n") {
					if k, v, ok := strings.Cut(line, "="); ok {
						want[k] = v
					}
				}
				maps.DeleteFunc(want, func(_, v string) bool { return v == "" })
			}
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(exe, slices.Sorted(maps.Keys(shimKeys(t)))...)
			cmd.Env = append(os.Environ(), ConfEnv+"="+path)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("confread: %v\n%s", err, stderr.String())
			}
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
				if k, v, ok := strings.Cut(line, "="); ok {
					got[k] = v
				}
			}
			if !maps.Equal(got, want) {
				t.Errorf("the shim has %v; cabi.Conf %v (%v)", got, want, goErr)
			}
			if (goErr != nil) != strings.Contains(stderr.String(), "softefa: "+ConfEnv+"=") {
				t.Errorf("cabi.Conf: %v; the shim said %q", goErr, stderr.String())
			}
		})
	}
}

// fullConf is a Conf with every field set.
func fullConf() Conf {
	return Conf{Engine: "/cache/libsoftefa.so", DevPath: "/dev/infiniband/uverbs_softefa0", DevMajor: 231,
		DevMinor: 250, Name: "efa_3", PartID: 0xefa1, Device: "/run/softefa/efa_0.sock",
		Addr: netip.MustParseAddrPort("[fd00::1]:4791"), SysfsRoot: "/tmp/softefa-sysfs-1",
		IP: netip.MustParseAddr("10.0.0.2"), Paths: 8, RxSpin: 250 * time.Microsecond,
		NoSparseCopies: true, NoOffload: true, Debug: true}
}

func TestConfRoundTrip(t *testing.T) {
	for _, c := range []Conf{{}, fullConf(), {DevPath: "/dev/x", Name: "a=b", RxSpin: time.Nanosecond}} {
		text, err := c.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got Conf
		if err := got.UnmarshalText(text); err != nil || !reflect.DeepEqual(got, c) {
			t.Errorf("%q: read back %+v, %v; want %+v", text, got, err, c)
		}
	}
	if _, err := (Conf{Name: "a\nengine=/tmp/evil.so"}).MarshalText(); err == nil {
		t.Error("a name with a line break in it was written")
	}
}

func TestConfBadLines(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"name=efa_0\nnonsense\n", "line 2: want key=value"},
		{"colour=blue\n", `line 1: "colour": no such key`},
		{"paths=0\n", `line 1: paths="0": want 1 to 255`},
		{"rx-spin=-1ms\n", "want a duration of 0 or more"},
		{"debug=maybe\n", "want true or false"},
		{"name=a\x00b\n", "a NUL"},
		{strings.Repeat("\ndebug=1", confLines+1), "line 66: more than 64 lines"},
		{"dev-rdev=231\n", "want MAJOR:MINOR"},
		{"addr=127.0.0.1\n", `addr="127.0.0.1"`},
		{"part-id=0x1efa1efa1\n", `part-id="0x1efa1efa1"`},
	} {
		var conf Conf
		err := conf.UnmarshalText([]byte(c.text))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.text, err, c.want)
		}
	}
}

// TestConfDeviceConfig: the file's settings reach the engine's config.Device, and its receive
// loop does not spin unless the file says for how long.
func TestConfDeviceConfig(t *testing.T) {
	c := fullConf()
	cfg := c.DeviceConfig()
	if cfg.Name != c.Name || cfg.VendorPartID != c.PartID || cfg.Paths != c.Paths || cfg.RxSpin != c.RxSpin ||
		!cfg.NoSparseCopies || !cfg.NoOffload {
		t.Errorf("DeviceConfig: %+v from %+v", cfg, c)
	}
	if cfg := (Conf{}).DeviceConfig(); cfg.RxSpin >= 0 {
		t.Errorf("no rx-spin: RxSpin %v, want negative (never)", cfg.RxSpin)
	}
	for _, c := range []struct {
		c    Conf
		want netip.AddrPort
	}{
		{Conf{}, netip.AddrPort{}},
		{Conf{Device: "/run/x.sock"}, netip.AddrPort{}},
		{Conf{SysfsRoot: "/tmp/r"}, netip.MustParseAddrPort("127.0.0.1:0")},
		{Conf{SysfsRoot: "/tmp/r", IP: netip.MustParseAddr("10.1.2.3")}, netip.MustParseAddrPort("10.1.2.3:0")},
		{Conf{Addr: netip.MustParseAddrPort("10.1.2.3:4791")}, netip.MustParseAddrPort("10.1.2.3:4791")},
	} {
		if got := c.c.ListenAddr(); got != c.want {
			t.Errorf("ListenAddr of %+v: %v, want %v", c.c, got, c.want)
		}
	}
}

// FuzzConf: any text is read without a panic, and what is read writes back to text that reads
// the same.
func FuzzConf(f *testing.F) {
	text, _ := fullConf().MarshalText()
	f.Add(text)
	f.Add([]byte("name=efa_0\n\npaths=4"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Conf
		if c.UnmarshalText(b) != nil {
			return
		}
		again, err := c.MarshalText()
		if err != nil {
			return // a value with a NUL in it
		}
		var d Conf
		if err := d.UnmarshalText(again); err != nil || !reflect.DeepEqual(c, d) {
			t.Fatalf("%q read as %+v, written as %q, read back as %+v, %v", b, c, again, d, err)
		}
	})
}

// TestEveryVariableListed: the shipped code (Go outside tests, the shim's C) names two SOFTEFA_
// variables, both in docs/settings.md: the program's file, which is how softefa run reaches the
// programs it starts, and the encryption key (never a flag: other users can read flags).
func TestEveryVariableListed(t *testing.T) {
	allowed := map[string]bool{ConfEnv: true, "SOFTEFA_KEY": true}
	doc, err := os.ReadFile("../docs/settings.md")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`SOFTEFA_[A-Z0-9_]+`)
	seen := map[string]string{}
	err = filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == "testdata" || d.Name() == "bench" || d.Name() == "thirdparty" ||
			strings.HasPrefix(d.Name(), ".") && d.Name() != ".."):
			return filepath.SkipDir
		case d.IsDir() || strings.HasSuffix(p, "_test.go") ||
			!strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, ".c"):
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, v := range name.FindAllString(string(b), -1) {
			seen[v] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for v, p := range seen {
		if !allowed[v] {
			t.Errorf("%s (%s) is neither the program's file nor the key: make it a config.Device field, a flag, or a key of the program's file", v, p)
		}
		if !strings.Contains(string(doc), "`"+v+"`") {
			t.Errorf("%s (%s) is not listed in docs/settings.md", v, p)
		}
	}
	if len(seen) < len(allowed) {
		t.Errorf("found %d variables, expected about %d: the walk missed files", len(seen), len(allowed))
	}
}
