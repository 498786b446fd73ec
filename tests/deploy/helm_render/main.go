// helm_render renders a Helm chart the way `helm template` does, for tests on machines
// where Helm itself cannot be installed. It uses the same engine Helm uses: Go's
// text/template with the sprig function library (Debian: golang-github-masterminds-sprig-dev)
// plus Helm's own additions (include, tpl, required, toYaml, fromYaml, toJson, fromJson,
// lookup), values coalesced like Helm's (later files win, maps merge, null deletes),
// numbers decoded as float64 as Helm's YAML→JSON path does, and the coalesced values
// checked against the chart's values.schema.json with gojsonschema, as Helm 3 does
// (Debian: golang-github-xeipuuv-gojsonschema-dev).
//
// usage: helm_render CHART_DIR [-f VALUES.yaml]... [--namespace NS] [--release NAME]
//
// Prints every rendered manifest as a YAML stream, each document headed by
// `# Source: CHART/templates/FILE`, exactly like `helm template`. Exits 1 with the
// template error on stderr when a template fails (missing value, bad syntax, `required`).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	// GOPATH mode (Debian's /usr/share/gocode): sprig v3 lives at its unversioned path;
	// its own /v3 imports resolve there through Go's minimal module compatibility.
	"github.com/Masterminds/sprig"
	"github.com/xeipuuv/gojsonschema"
	yamlv2 "gopkg.in/yaml.v2"
	yamlv3 "gopkg.in/yaml.v3"
)

// APIVersions mirrors Helm's chartutil.VersionSet: `.Capabilities.APIVersions.Has`.
type APIVersions []string

// Has reports whether an API group/version (or group/version/Kind) is available.
func (v APIVersions) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// KubeVersion mirrors Helm's chartutil.KubeVersion.
type KubeVersion struct {
	Version string
	Major   string
	Minor   string
}

// Capabilities mirrors Helm's chartutil.Capabilities (what `helm template` assumes).
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions APIVersions
}

// jsonRoundTrip gives the types Helm sees: YAML is turned into JSON and decoded with
// encoding/json (sigs.k8s.io/yaml), so every number is a float64 and maps are
// map[string]interface{}.
func jsonRoundTrip(v interface{}) (interface{}, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out interface{}
	err = json.Unmarshal(data, &out)
	return out, err
}

func readYAMLMap(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw interface{}
	if err := yamlv3.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if raw == nil {
		return map[string]interface{}{}, nil
	}
	converted, err := jsonRoundTrip(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	m, ok := converted.(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("%s: not a mapping", path)
	}
	return m, nil
}

// coalesce merges src into dst as Helm does for -f files: src wins, nested maps merge,
// a null in src deletes the key.
func coalesce(dst, src map[string]interface{}) {
	for key, value := range src {
		if value == nil {
			delete(dst, key)
			continue
		}
		srcMap, srcIsMap := value.(map[string]interface{})
		dstMap, dstIsMap := dst[key].(map[string]interface{})
		if srcIsMap && dstIsMap {
			coalesce(dstMap, srcMap)
		} else {
			dst[key] = value
		}
	}
}

// toYAML is Helm's toYaml: sigs.k8s.io/yaml's Marshal (JSON, then yaml.v2), without the
// trailing newline.
func toYAML(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	var obj interface{}
	if err := yamlv2.Unmarshal(data, &obj); err != nil {
		return ""
	}
	out, err := yamlv2.Marshal(obj)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(out), "\n")
}

func fromYAML(s string) map[string]interface{} {
	var raw interface{}
	if err := yamlv3.Unmarshal([]byte(s), &raw); err != nil {
		return map[string]interface{}{"Error": err.Error()}
	}
	converted, err := jsonRoundTrip(raw)
	if err != nil {
		return map[string]interface{}{"Error": err.Error()}
	}
	m, _ := converted.(map[string]interface{})
	return m
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

const recursionMax = 1000

func funcMap(t *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	// Helm removes these two for security.
	delete(f, "env")
	delete(f, "expandenv")
	included := map[string]int{}
	f["include"] = func(name string, data interface{}) (string, error) {
		if included[name] > recursionMax {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		included[name]++
		defer func() { included[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		clone, err := t.Clone()
		if err != nil {
			return "", err
		}
		child, err := clone.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf strings.Builder
		err = child.Execute(&buf, data)
		return strings.ReplaceAll(buf.String(), "<no value>", ""), err
	}
	f["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, errors.New(warn)
		}
		if s, ok := val.(string); ok && s == "" {
			return val, errors.New(warn)
		}
		return val, nil
	}
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["toJson"] = toJSON
	f["fromJson"] = fromJSON
	f["toToml"] = func(interface{}) string { return "" }
	// `helm template` has no cluster: lookup finds nothing.
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	return f
}

func run(args []string) error {
	if len(args) < 1 {
		return errors.New("usage: helm_render CHART_DIR [-f VALUES]... [--namespace NS] [--release NAME]")
	}
	chartDir := args[0]
	namespace, release := "default", "loom"
	var valueFiles []string
	for i := 1; i < len(args); i++ {
		if i+1 >= len(args) {
			return fmt.Errorf("%s needs a value", args[i])
		}
		switch args[i] {
		case "-f", "--values":
			valueFiles = append(valueFiles, args[i+1])
		case "--namespace", "-n":
			namespace = args[i+1]
		case "--release":
			release = args[i+1]
		default:
			return fmt.Errorf("unknown flag %s", args[i])
		}
		i++
	}

	chartMeta, err := readYAMLMap(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return err
	}
	for _, key := range []string{"apiVersion", "name", "version"} {
		if _, ok := chartMeta[key]; !ok {
			return fmt.Errorf("Chart.yaml: missing %s", key)
		}
	}
	chartName := fmt.Sprint(chartMeta["name"])
	// Templates see Chart fields capitalized (chart.Metadata's Go field names).
	chart := map[string]interface{}{}
	for key, value := range chartMeta {
		chart[strings.ToUpper(key[:1])+key[1:]] = value
	}

	values, err := readYAMLMap(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return err
	}
	for _, file := range valueFiles {
		override, err := readYAMLMap(file)
		if err != nil {
			return err
		}
		coalesce(values, override)
	}

	if err := validateValues(chartDir, chartName, values); err != nil {
		return err
	}

	templatesDir := filepath.Join(chartDir, "templates")
	entries, err := os.ReadDir(templatesDir)
	if err != nil {
		return err
	}
	t := template.New("gotpl")
	t.Funcs(funcMap(t))
	t.Option("missingkey=zero")
	var names []string
	for _, entry := range entries {
		if entry.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(templatesDir, entry.Name()))
		if err != nil {
			return err
		}
		name := chartName + "/templates/" + entry.Name()
		if _, err := t.New(name).Parse(string(data)); err != nil {
			return err
		}
		names = append(names, name)
	}
	sort.Strings(names)

	top := map[string]interface{}{
		"Values": values,
		"Chart":  chart,
		"Release": map[string]interface{}{
			"Name": release, "Namespace": namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1,
		},
		"Capabilities": Capabilities{
			KubeVersion: KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"},
			APIVersions: APIVersions{"v1", "apps/v1", "policy/v1"},
		},
		"Files": map[string]interface{}{},
	}
	var out bytes.Buffer
	for _, name := range names {
		base := filepath.Base(name)
		if strings.HasPrefix(base, "_") {
			continue // partials: only `define`s
		}
		scope := map[string]interface{}{}
		for k, v := range top {
			scope[k] = v
		}
		scope["Template"] = map[string]interface{}{"Name": name, "BasePath": chartName + "/templates"}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, scope); err != nil {
			return err
		}
		rendered := strings.ReplaceAll(buf.String(), "<no value>", "")
		if base == "NOTES.txt" || strings.TrimSpace(rendered) == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, strings.TrimSpace(rendered))
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}

// validateValues is Helm's chartutil.ValidateAgainstSchema: the coalesced values against
// values.schema.json, when the chart has one.
func validateValues(chartDir, chartName string, values map[string]interface{}) error {
	schema, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema),
		gojsonschema.NewGoLoader(values))
	if err != nil {
		return fmt.Errorf("values.schema.json: %w", err)
	}
	if result.Valid() {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n", chartName)
	for _, e := range result.Errors() {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return errors.New(strings.TrimSuffix(b.String(), "\n"))
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "helm_render:", err)
		os.Exit(1)
	}
}
