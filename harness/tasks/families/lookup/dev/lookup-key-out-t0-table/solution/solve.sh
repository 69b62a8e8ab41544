#!/bin/bash
cd /app && awk '{print $2}' key.txt > out.txt
