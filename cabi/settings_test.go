//go:build linux

package cabi

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSettingsReadAndListed: every setting softefa run offers is read by the program's engine or
// shim under its variable's name, and listed with its flag and variable in docs/settings.md, the
// one table of settings.
func TestSettingsReadAndListed(t *testing.T) {
	var src strings.Builder
	files, _ := filepath.Glob("shim/*.c")
	files = append(files, "libengine/main.go")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	doc, err := os.ReadFile("../docs/settings.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Settings {
		if !strings.Contains(src.String(), `"`+s.Env+`"`) {
			t.Errorf("%s (--%s) is read by neither the engine nor the shim", s.Env, s.Flag)
		}
		if !strings.Contains(string(doc), "`--"+s.Flag+"`") || !strings.Contains(string(doc), s.Env) {
			t.Errorf("docs/settings.md does not list --%s (%s)", s.Flag, s.Env)
		}
	}
}

// plumbing are the variables by which softefa run (Prepare) tells the program's shim and engine
// where things are, from its flags.
var plumbing = []string{"SOFTEFA_ENGINE", "SOFTEFA_DEV_PATH", "SOFTEFA_DEV_RDEV", "SOFTEFA_NAME",
	"SOFTEFA_PART_ID", "SOFTEFA_ADDR", "SOFTEFA_IP", "SOFTEFA_PATHS", "SOFTEFA_SYSFS_ROOT", "SOFTEFA_DEVICE"}

// TestEveryVariableListed: every SOFTEFA_ variable the shipped code names (Go outside tests,
// the shim's C) is in docs/settings.md, and none but softefa run's settings, its plumbing to the
// program's shim and engine, and the encryption key (never a flag: other users can read flags).
func TestEveryVariableListed(t *testing.T) {
	allowed := map[string]bool{"SOFTEFA_KEY": true}
	for _, v := range plumbing {
		allowed[v] = true
	}
	for _, s := range Settings {
		allowed[s.Env] = true
	}
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
			t.Errorf("%s (%s) is neither a softefa run setting nor its plumbing: make it a config.Device field or a flag", v, p)
		}
		if !strings.Contains(string(doc), "`"+v+"`") {
			t.Errorf("%s (%s) is not listed in docs/settings.md", v, p)
		}
	}
	if len(seen) < len(allowed)-1 {
		t.Errorf("found %d variables, expected about %d: the walk missed files", len(seen), len(allowed))
	}
}

func TestSettingValues(t *testing.T) {
	rxSpin, noOffload := Settings[0], Settings[0]
	for _, s := range Settings {
		switch s.Flag {
		case "rx-spin":
			rxSpin = s
		case "no-offload":
			noOffload = s
		}
	}
	for _, c := range []struct {
		s       Setting
		in, out string
	}{
		{rxSpin, "200us", "200µs"}, {rxSpin, "0", "0s"}, {rxSpin, "-1ms", ""}, {rxSpin, "soon", ""},
		{noOffload, "true", "1"}, {noOffload, "false", "0"}, {noOffload, "yes", ""},
	} {
		got, err := c.s.EnvValue(c.in)
		if got != c.out || (err != nil) != (c.out == "") {
			t.Errorf("--%s %q: got %q, %v; want %q", c.s.Flag, c.in, got, err, c.out)
		}
	}
	t.Setenv("SOFTEFA_RXSPIN", "250us")
	if d, ok, err := EnvDuration("SOFTEFA_RXSPIN"); d != 250*time.Microsecond || !ok || err != nil {
		t.Errorf("EnvDuration: %v %v %v", d, ok, err)
	}
	t.Setenv("SOFTEFA_RXSPIN", "-1s")
	if _, _, err := EnvDuration("SOFTEFA_RXSPIN"); err == nil || !strings.Contains(err.Error(), "SOFTEFA_RXSPIN") {
		t.Errorf("EnvDuration of -1s: %v, want an error naming the variable", err)
	}
	t.Setenv("SOFTEFA_NO_OFFLOAD", "maybe")
	if _, err := EnvBool("SOFTEFA_NO_OFFLOAD"); err == nil {
		t.Error("EnvBool of maybe: no error")
	}
}
