from gkx_autocache._cli.main import main

raise SystemExit(main())
