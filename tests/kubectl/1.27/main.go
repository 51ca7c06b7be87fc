// Command kubectl: the kubectl of the release go.mod pins, started the way the release binary
// starts it.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// Registers the client credential plugins (exec, OIDC) the release binary carries.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	// RunNoErrOutput parses the flags, sets up logging and runs the command; the error is left to
	// CheckErr, which prints it as kubectl does and exits non-zero.
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
