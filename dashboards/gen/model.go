package main

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The subset of Grafana's dashboard model (schema version 39) the dashboards use. Struct
// fields marshal in declaration order, so the output is stable byte for byte.

type Dashboard struct {
	Description   string       `json:"description"`
	Editable      bool         `json:"editable"`
	GraphTooltip  int          `json:"graphTooltip"`
	Links         []Link       `json:"links"`
	Panels        []*Panel     `json:"panels"`
	Refresh       string       `json:"refresh"`
	SchemaVersion int          `json:"schemaVersion"`
	Tags          []string     `json:"tags"`
	Templating    Templating   `json:"templating"`
	Time          TimeRange    `json:"time"`
	Timepicker    struct{}     `json:"timepicker"`
	Timezone      string       `json:"timezone"`
	Title         string       `json:"title"`
	UID           string       `json:"uid"`
	Version       int          `json:"version"`
	layout        layoutCursor `json:"-"`
}

type Link struct {
	AsDropdown  bool     `json:"asDropdown"`
	IncludeVars bool     `json:"includeVars"`
	KeepTime    bool     `json:"keepTime"`
	Tags        []string `json:"tags"`
	TargetBlank bool     `json:"targetBlank"`
	Title       string   `json:"title"`
	Type        string   `json:"type"`
}

type TimeRange struct {
	From string `json:"from"`
	To   string `json:"to"`
}

type Templating struct {
	List []*Variable `json:"list"`
}

type Variable struct {
	AllValue    string      `json:"allValue,omitempty"`
	Current     Current     `json:"current"`
	Datasource  *Datasource `json:"datasource,omitempty"`
	Definition  string      `json:"definition,omitempty"`
	Description string      `json:"description"`
	Hide        int         `json:"hide"`
	IncludeAll  bool        `json:"includeAll"`
	Label       string      `json:"label"`
	Multi       bool        `json:"multi"`
	Name        string      `json:"name"`
	Options     []any       `json:"options"`
	Query       any         `json:"query"`
	Refresh     int         `json:"refresh"`
	Regex       string      `json:"regex"`
	Sort        int         `json:"sort,omitempty"`
	Type        string      `json:"type"`
}

type Current struct {
	Selected bool `json:"selected,omitempty"`
	Text     any  `json:"text,omitempty"`
	Value    any  `json:"value,omitempty"`
}

type VariableQuery struct {
	Query string `json:"query"`
	RefID string `json:"refId"`
}

type Datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type GridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type Panel struct {
	Collapsed   *bool          `json:"collapsed,omitempty"`
	Datasource  *Datasource    `json:"datasource,omitempty"`
	Description string         `json:"description,omitempty"`
	FieldConfig *FieldConfig   `json:"fieldConfig,omitempty"`
	GridPos     GridPos        `json:"gridPos"`
	ID          int            `json:"id"`
	Options     map[string]any `json:"options,omitempty"`
	Panels      []*Panel       `json:"panels,omitempty"`
	Targets     []*Target      `json:"targets,omitempty"`
	Title       string         `json:"title"`
	Type        string         `json:"type"`
}

type FieldConfig struct {
	Defaults  FieldDefaults `json:"defaults"`
	Overrides []any         `json:"overrides"`
}

type FieldDefaults struct {
	Color      map[string]string `json:"color"`
	Custom     any               `json:"custom,omitempty"`
	Decimals   *int              `json:"decimals,omitempty"`
	Mappings   []ValueMapping    `json:"mappings"`
	Max        *float64          `json:"max,omitempty"`
	Min        *float64          `json:"min,omitempty"`
	Thresholds Thresholds        `json:"thresholds"`
	Unit       string            `json:"unit"`
}

type Thresholds struct {
	Mode  string      `json:"mode"`
	Steps []Threshold `json:"steps"`
}

type Threshold struct {
	Color string   `json:"color"`
	Value *float64 `json:"value"`
}

type ValueMapping struct {
	Options map[string]MappingResult `json:"options"`
	Type    string                   `json:"type"`
}

type MappingResult struct {
	Color string `json:"color,omitempty"`
	Index int    `json:"index"`
	Text  string `json:"text"`
}

type Target struct {
	Datasource   *Datasource `json:"datasource"`
	EditorMode   string      `json:"editorMode"`
	Expr         string      `json:"expr"`
	Instant      bool        `json:"instant"`
	LegendFormat string      `json:"legendFormat"`
	Range        bool        `json:"range"`
	RefID        string      `json:"refId"`
}

// The panel datasource: the dashboard's datasource variable.
var promDS = &Datasource{Type: "prometheus", UID: "${datasource}"}

func ptr[T any](v T) *T { return &v }

// layoutCursor places panels left to right in rows of 24 columns.
type layoutCursor struct {
	x, y, rowH, nextID int
}

func (d *Dashboard) place(w, h int) GridPos {
	c := &d.layout
	if c.x+w > 24 {
		c.x, c.y, c.rowH = 0, c.y+c.rowH, 0
	}
	p := GridPos{H: h, W: w, X: c.x, Y: c.y}
	c.x += w
	if h > c.rowH {
		c.rowH = h
	}
	return p
}

func (d *Dashboard) id() int {
	d.layout.nextID++
	return d.layout.nextID
}

// row starts a new (expanded) row of panels.
func (d *Dashboard) row(title string) {
	c := &d.layout
	if c.x > 0 {
		c.x, c.y, c.rowH = 0, c.y+c.rowH, 0
	}
	d.Panels = append(d.Panels, &Panel{
		Collapsed: ptr(false),
		GridPos:   GridPos{H: 1, W: 24, X: 0, Y: c.y},
		ID:        d.id(),
		Title:     title,
		Type:      "row",
	})
	c.y++
}

// q is one query of a panel.
type q struct {
	expr, legend string
}

func targets(instant bool, qs []q) []*Target {
	var ts []*Target
	for i, x := range qs {
		ts = append(ts, &Target{
			Datasource:   promDS,
			EditorMode:   "code",
			Expr:         x.expr,
			Instant:      instant,
			LegendFormat: x.legend,
			Range:        !instant,
			RefID:        string(rune('A' + i)),
		})
	}
	return ts
}

var green = Threshold{Color: "green", Value: nil}

// timeseries adds a time series panel of width w.
func (d *Dashboard) timeseries(w int, title, unit, description string, qs ...q) *Panel {
	p := &Panel{
		Datasource:  promDS,
		Description: description,
		FieldConfig: &FieldConfig{
			Defaults: FieldDefaults{
				Color: map[string]string{"mode": "palette-classic"},
				Custom: map[string]any{
					"drawStyle":         "line",
					"fillOpacity":       10,
					"lineWidth":         1,
					"pointSize":         4,
					"showPoints":        "never",
					"spanNulls":         false,
					"axisSoftMin":       0,
					"lineInterpolation": "linear",
				},
				Mappings:   []ValueMapping{},
				Thresholds: Thresholds{Mode: "absolute", Steps: []Threshold{green}},
				Unit:       unit,
			},
			Overrides: []any{},
		},
		GridPos: d.place(w, 8),
		ID:      d.id(),
		Options: map[string]any{
			"legend":  map[string]any{"calcs": []string{"lastNotNull", "max"}, "displayMode": "table", "placement": "bottom", "showLegend": true},
			"tooltip": map[string]any{"mode": "multi", "sort": "desc"},
		},
		Targets: targets(false, qs),
		Title:   title,
		Type:    "timeseries",
	}
	d.Panels = append(d.Panels, p)
	return p
}

// stat adds a stat panel of width w showing the last value of an instant query. mapping
// turns values into words (nil: show the number); steps colour it.
func (d *Dashboard) stat(w int, title, unit, description string, mapping map[string]MappingResult, steps []Threshold, qs ...q) *Panel {
	mappings := []ValueMapping{}
	if mapping != nil {
		mappings = append(mappings, ValueMapping{Options: mapping, Type: "value"})
	}
	if steps == nil {
		steps = []Threshold{{Color: "text", Value: nil}}
	}
	textMode := "value"
	if len(qs) > 1 {
		textMode = "value_and_name"
	}
	p := &Panel{
		Datasource:  promDS,
		Description: description,
		FieldConfig: &FieldConfig{
			Defaults: FieldDefaults{
				Color:      map[string]string{"mode": "thresholds"},
				Mappings:   mappings,
				Thresholds: Thresholds{Mode: "absolute", Steps: steps},
				Unit:       unit,
			},
			Overrides: []any{},
		},
		GridPos: d.place(w, 4),
		ID:      d.id(),
		Options: map[string]any{
			"colorMode":     "background",
			"graphMode":     "none",
			"justifyMode":   "center",
			"orientation":   "auto",
			"reduceOptions": map[string]any{"calcs": []string{"lastNotNull"}, "fields": "", "values": false},
			"textMode":      textMode,
		},
		Targets: targets(true, qs),
		Title:   title,
		Type:    "stat",
	}
	d.Panels = append(d.Panels, p)
	return p
}

// steps builds thresholds: a base colour, then value, colour pairs.
func steps(base string, pairs ...any) []Threshold {
	s := []Threshold{{Color: base, Value: nil}}
	for i := 0; i+1 < len(pairs); i += 2 {
		var v float64
		switch n := pairs[i].(type) {
		case int:
			v = float64(n)
		case float64:
			v = n
		default:
			panic(fmt.Sprintf("threshold value %v", pairs[i]))
		}
		s = append(s, Threshold{Color: pairs[i+1].(string), Value: ptr(v)})
	}
	return s
}

// words maps values to text and colour: "1", "on", "green", "0", "off", "red", ...
func words(triples ...string) map[string]MappingResult {
	m := map[string]MappingResult{}
	for i := 0; i+2 < len(triples); i += 3 {
		m[triples[i]] = MappingResult{Text: triples[i+1], Color: triples[i+2], Index: i / 3}
	}
	return m
}

// JSON renders a dashboard the way it is committed: indented by two spaces, no HTML escaping
// (PromQL's > and < stay readable), a final newline.
func (d *Dashboard) JSON() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
