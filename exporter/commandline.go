package exporter

import (
	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	webflag "github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/proxyhealth/proxyhealth/exporter/diagnose"
)

// commandLine is every flag of the exporter and of `proxyhealth diagnose`, defined but not
// parsed: Main parses it, and docs/flags.md is written from it.
type commandLine struct {
	app            *kingpin.Application
	diagnoseCmd    *kingpin.CmdClause
	diagnoseCfg    *diagnose.Config
	stateDirCmd    *kingpin.CmdClause
	stateDirOwner  *string
	srv            *serverFlags
	webConfig      *web.FlagConfig
	paths          *Paths
	statusCfg      *statusConfig
	conditions     *nodeConditionsConfig
	report         *nodeReportConfig
	collectors     *collectorFlags
	promslogConfig *promslog.Config
}

func newCommandLine() *commandLine {
	app := kingpin.New("proxyhealth", "Prometheus exporter that tells whether Service traffic on this node is silently breaking, and why.")
	app.Command("serve", "Run the exporter (the default command).").Default()
	cl := &commandLine{app: app, srv: &serverFlags{}, promslogConfig: &promslog.Config{}}
	cl.diagnoseCmd = app.Command("diagnose", diagnose.Help)
	cl.diagnoseCfg = diagnose.AddFlags(cl.diagnoseCmd)
	cl.stateDirCmd = app.Command("prepare-state-dir", "Create --conntrack.invalid-reasons.state-dir, mode 0700, and give it to --owner: the chart's init container runs it as root with CAP_CHOWN alone, since the kubelet creates a hostPath directory root's and the exporter runs as another user.")
	cl.stateDirOwner = cl.stateDirCmd.Flag("owner", "UID:GID of the exporter's user.").Required().String()
	cl.srv.addFlags(app)
	cl.webConfig = webflag.AddFlags(app, DefaultListenAddress)
	cl.paths = addPathFlags(app)
	cl.statusCfg = addStatusFlags(app)
	cl.conditions = addNodeConditionsFlags(app)
	cl.report = addNodeReportFlags(app)
	cl.collectors = addCollectorFlags(app, cl.paths)
	promslogflag.AddFlags(app, cl.promslogConfig)
	app.Version(version.Print("proxyhealth"))
	app.HelpFlag.Short('h')
	return cl
}
