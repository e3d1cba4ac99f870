"""The harness as an ACP agent on stdio (`hopline agent`, SPEC H-10): pipe, agent, runtime."""
