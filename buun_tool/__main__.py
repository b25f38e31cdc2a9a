from buun_tool.cli.app import main

main()
