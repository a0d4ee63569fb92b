from gkx_autocache._cli import main

raise SystemExit(main())
