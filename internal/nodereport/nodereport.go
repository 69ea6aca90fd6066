// Package nodereport is the layout of a node's report, the object each exporter writes (with
// --node-report) and `kubectl proxyhealth` reads: a ConfigMap in the exporters' namespace, one
// per node, holding the node's verdict as /status gives it, bounded in size. The exporter and
// the plugin both use it; it imports no more than the API types, so that the plugin does not
// link the exporter's dependencies.
package nodereport

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// The report's ConfigMap: its labels (the plugin lists reports by them), and its data keys.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelComponent = "app.kubernetes.io/component"
	NameValue      = "proxyhealth"
	ComponentValue = "node-report"
	// Selector selects every node's report.
	Selector = LabelName + "=" + NameValue + "," + LabelComponent + "=" + ComponentValue

	// KeyStatus holds the report: the /status document, compact, bounded by MaxBytes.
	KeyStatus = "status.json"
	// KeyHeartbeat holds the writer's heartbeat interval in seconds: a report is rewritten at
	// least this often, so one much older than that is from an exporter that stopped.
	KeyHeartbeat = "heartbeat_seconds"

	namePrefix = "proxyhealth-node-"
	// maxName is a ConfigMap name's limit (a DNS subdomain).
	maxName = 253
)

// MaxBytes bounds a report's status.json. A node's /status with a critical finding is 2 to 4
// KiB (BENCHMARKS.md, "Node reports"); this leaves room for dozens of findings, and keeps
// what 5,000 nodes write, and what a list of their reports returns, small.
const MaxBytes = 32 << 10

// Name is the report's ConfigMap name for node: "proxyhealth-node-<node>", or for a node name
// too long for that, its first characters and a hash of the whole name.
func Name(node string) string {
	if len(namePrefix)+len(node) <= maxName {
		return namePrefix + node
	}
	sum := sha256.Sum256([]byte(node))
	suffix := "-" + hex.EncodeToString(sum[:])[:16]
	return namePrefix + node[:maxName-len(namePrefix)-len(suffix)] + suffix
}

// Object is the report's ConfigMap for rep in namespace, owned by the Node (nodeUID): the
// garbage collector deletes it with its Node. rep must fit MaxBytes (Encode).
func Object(namespace string, rep []byte, node string, nodeUID types.UID, heartbeat time.Duration) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      Name(node),
			Namespace: namespace,
			Labels:    map[string]string{LabelName: NameValue, LabelComponent: ComponentValue},
			// No blockOwnerDeletion: it would need delete on Nodes, and a report must never
			// hold its Node back.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: nodeUID}},
		},
		Data: map[string]string{
			KeyStatus:    string(rep),
			KeyHeartbeat: strconv.FormatInt(int64(heartbeat/time.Second), 10),
		},
	}
}

// omittedEvidence stands in for the evidence of a finding left out to fit MaxBytes.
var omittedEvidence = map[string]string{"omitted": "the node report's size bound; the exporter's /status has it"}

// Encode is rep as a report's status.json, at most limit bytes: when the whole report is
// larger, the evidence of the last findings (the least severe: findings come worst first) is
// left out, then those findings themselves, a note saying how many; the first finding is always
// kept, so that the verdict (verdict.Judge) is the same. It fails only when even that does not
// fit.
func Encode(rep verdict.Report, limit int) ([]byte, error) {
	b, err := json.Marshal(rep)
	if err != nil {
		return nil, fmt.Errorf("encoding the report: %w", err)
	}
	if len(b) <= limit {
		return b, nil
	}
	findings := append([]verdict.Finding(nil), rep.Findings...)
	rep.Findings = findings
	for i := len(findings) - 1; i >= 0 && len(b) > limit; i-- {
		findings[i].Evidence = omittedEvidence
		if b, err = json.Marshal(rep); err != nil {
			return nil, fmt.Errorf("encoding the report: %w", err)
		}
	}
	notes := rep.Notes
	for kept := len(findings) - 1; kept >= 1 && len(b) > limit; kept-- {
		rep.Findings = findings[:kept]
		rep.Notes = append(append([]string(nil), notes...), fmt.Sprintf("%d more findings left out of this report (its size bound); the exporter's /status has them all.", len(findings)-kept))
		if b, err = json.Marshal(rep); err != nil {
			return nil, fmt.Errorf("encoding the report: %w", err)
		}
	}
	if len(b) > limit {
		return nil, fmt.Errorf("the report is %d bytes with one finding and no evidence, over the bound of %d", len(b), limit)
	}
	return b, nil
}

// Read is what a report's ConfigMap says: the node's report, when it was judged, and the
// writer's heartbeat (0 when not given).
type Read struct {
	Report    verdict.Report
	Heartbeat time.Duration
}

// Decode reads a report's ConfigMap, refusing a status.json over limit bytes.
func Decode(cm *corev1.ConfigMap, limit int) (Read, error) {
	raw, ok := cm.Data[KeyStatus]
	if !ok {
		return Read{}, fmt.Errorf("ConfigMap %s/%s has no %s", cm.Namespace, cm.Name, KeyStatus)
	}
	if len(raw) > limit {
		return Read{}, fmt.Errorf("its %s is %d bytes, over the bound of %d (--max-status-bytes); not read", KeyStatus, len(raw), limit)
	}
	var r Read
	if err := json.Unmarshal([]byte(raw), &r.Report); err != nil {
		return Read{}, fmt.Errorf("decoding %s: %w", KeyStatus, err)
	}
	// The object of one node holds that node's report: a report under another node's name is
	// not believed (a writer may overwrite another node's object, not rename what it says).
	if Name(r.Report.Node) != cm.Name {
		return Read{}, fmt.Errorf("it is the report of node %q, not of the node its name says", r.Report.Node)
	}
	if s, err := strconv.ParseInt(cm.Data[KeyHeartbeat], 10, 64); err == nil && s > 0 {
		r.Heartbeat = time.Duration(s) * time.Second
	}
	return r, nil
}
